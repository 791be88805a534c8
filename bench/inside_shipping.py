"""What it costs a container's main process to load the in-container code, by how the code is shipped.

Usage: .venv/bin/python bench/inside_shipping.py [--rounds 40]

Inside one container of the base image, fresh ``python3 -I -S -c`` processes load the ``inside`` package, the ways
taken in turn each round, and report the wall and CPU time from the start of their command to the code loaded (not
run). Each way is timed twice: as a container does it, and with the standard library's modules imported before the
clock starts, which leaves what the way itself costs (decoding, unmarshalling, making modules, finding them):

- one source (as shipped): the modules joined into one source, compiled here, one code object executed
  (``shipping.MAIN_COMMAND``'s bootstrap);
- the same, compiled in the container (what an image with another minor version of Python does);
- a package from a dict: each module compiled here, executed into a module of its own in ``sys.modules``;
- a zip on ``sys.path``: the modules' bytecode in a zip written to /dev/shm, imported by zipimport.

Every way reads its code from the environment, zlib-compressed and base64-encoded, as the shipped one does, and
decodes its sources too (what it would compile where the bytecode's magic differs), as the shipped one does.
"""

from __future__ import annotations

import argparse
import ast
import base64
import importlib.util
import io
import json
import marshal
import os
import tempfile
import time
import zipfile
import zlib
from importlib import resources
from pathlib import Path

import docker
from docker.types import Mount

from terminus_env.sandbox import BASE_IMAGE
from terminus_env.sandbox.owner import Owner, new_run_id
from terminus_env.sandbox.shipping import MAIN_COMMAND, code_variables
from terminus_env.sandbox.shipping import inside_source as joined

AFTER_STDLIB = "(stdlib first)"
PACKAGE = "inside"  # the package's name in the container, for the two ways that keep it a package
SHIPPED = MAIN_COMMAND[MAIN_COMMAND.index("-c") + 1]  # the bootstrap a container runs
_DECODE = "d=lambda n:zlib.decompress(binascii.a2b_base64(os.environ.pop(n)));"
BOOTSTRAPS = {
    "one source (as shipped)": SHIPPED,
    "one source, compiled in the container": SHIPPED,
    "a package from a dict": (
        "import os,sys,zlib,binascii,marshal,types;" + _DECODE + "s=d('BENCH_SOURCE');"
        "p=types.ModuleType('inside');p.__path__=[];"
        "sys.modules['inside']=p\nfor n,c in marshal.loads(d('BENCH_CODE')):\n"
        " m=types.ModuleType('inside.'+n);m.__package__='inside';sys.modules[m.__name__]=m;exec(c,m.__dict__)"
    ),
    "a zip on sys.path": (
        "import os,sys,zlib,binascii;" + _DECODE + "s=d('BENCH_SOURCE');"
        "z='/dev/shm/terminus-inside-%d.zip'%os.getpid();f=open(z,'wb');f.write(d('BENCH_CODE'));f.close();"
        "sys.path.insert(0,z);import inside.main;os.unlink(z)"
    ),
}
RUNNER = """
import json, os, subprocess, sys
ways = json.load(open("/bench/ways.json"))
times = {name: [] for name in ways}
for _ in range(int(sys.argv[1])):
    for name, (command, env) in ways.items():
        out = subprocess.run(["python3", "-I", "-S", "-c", command, "bench"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, check=True, universal_newlines=True).stdout
        times[name].append([float(value) for value in out.split()[-2:]])
print(json.dumps(times))
"""


def modules() -> dict[str, str]:
    folder = resources.files("terminus_env.sandbox").joinpath(PACKAGE)
    return {
        entry.name[: -len(".py")]: entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".py")
    }


def order() -> list[str]:
    """The modules in the order the joined source has them (each after those it imports)."""
    source = joined()
    return [line.split("/")[1][:-3] for line in source.splitlines() if line.startswith("# ----- inside/")]


def pack(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode()


def ways() -> dict[str, tuple[str, dict[str, str]]]:
    sources = modules()
    names = order()
    compiled = [(name, compile(sources[name], f"inside/{name}.py", "exec")) for name in names]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zipped:
        zipped.writestr(f"{PACKAGE}/__init__.pyc", _pyc(compile(sources["__init__"], "__init__.py", "exec")))
        for name, code in compiled:
            zipped.writestr(f"{PACKAGE}/{name}.pyc", _pyc(code))
    shipped = code_variables(joined())
    elsewhere = code_variables(joined(), b"\0\0\r\n")  # no Python has this magic: the source is compiled
    fallback = pack(marshal.dumps(sources))  # each way carries its sources, for a Python of another magic
    payloads = [shipped, elsewhere, {"BENCH_CODE": pack(marshal.dumps(compiled)), "BENCH_SOURCE": fallback},
                {"BENCH_CODE": pack(archive.getvalue()), "BENCH_SOURCE": fallback}]  # fmt: skip
    stdlib = sorted({name for source in sources.values() for name in _stdlib_imports(source)})
    timed = (
        "import time;t0,c0=time.perf_counter(),time.process_time()\n{}\n"
        "print(time.perf_counter()-t0,time.process_time()-c0)"
    )
    found = {}
    for name, env in zip(BOOTSTRAPS, payloads, strict=True):
        found[name] = (timed.format(BOOTSTRAPS[name]), env)
        found[name + " " + AFTER_STDLIB] = ("import " + ",".join(stdlib) + "\n" + timed.format(BOOTSTRAPS[name]), env)
    return found


def _stdlib_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    return [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]


def _pyc(code: object) -> bytes:
    """A .pyc without a source to check against (zipimport then takes it as it is)."""
    return importlib.util.MAGIC_NUMBER + b"\0" * 12 + marshal.dumps(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    client = docker.from_env()
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "ways.json").write_text(json.dumps(ways()))
        os.chmod(folder, 0o755)
        load_before = os.getloadavg()
        started = time.perf_counter()
        out = client.containers.run(
            BASE_IMAGE, ["python3", "-c", RUNNER, str(args.rounds)], remove=True, network_disabled=True,
            mounts=[Mount("/bench", folder, type="bind", read_only=True)], labels=Owner.current().labels(new_run_id()),
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    times = json.loads(out)
    print(f"Loading the in-container code in a fresh python3 (ms, {args.rounds} rounds in turn, {elapsed:.0f} s; "
          f"load {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after)")  # fmt: skip
    print(f"  {'way':<56} {'wall p50':>9} {'p10':>7} {'p90':>7} {'CPU p50':>9} {'p10':>7} {'p90':>7}")
    for name, values in sorted(times.items(), key=lambda item: AFTER_STDLIB in item[0]):
        cells = []
        for column in (0, 1):
            ordered = sorted(value[column] for value in values)
            cells += [ordered[int(q * (len(ordered) - 1))] * 1000 for q in (0.5, 0.1, 0.9)]
        print(f"  {name:<56} {cells[0]:9.2f} {cells[1]:7.2f} {cells[2]:7.2f}", end="")
        print(f" {cells[3]:9.2f} {cells[4]:7.2f} {cells[5]:7.2f}")


if __name__ == "__main__":
    main()
