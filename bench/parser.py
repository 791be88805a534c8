"""Replies parsed per second: terminus-env's parser against Harbor's, on the same typical replies.

Usage: .venv/bin/python bench/parser.py [--replies 2000] [--rounds 7] [--harbor-version 0.26.0]

Harbor's parser is the module harbor/agents/terminus_2/terminus_xml_plain_parser.py of the
``harbor`` wheel on PyPI. The wheel is fetched with pip into .bench-cache/ (git-ignored) and the
one module is loaded from it without installing Harbor. If that fails, the benchmark says so and
reports our figure alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from terminus_env.protocol import parse_reply

CACHE = Path(__file__).resolve().parent.parent / ".bench-cache"
HARBOR_MODULE = "harbor/agents/terminus_2/terminus_xml_plain_parser.py"

ANALYSES = [
    "The directory listing shows a Makefile and a src/ folder; nothing has been built yet.",
    "The test run failed with ModuleNotFoundError: No module named 'numpy'. The requirements file lists "
    "numpy but it was never installed, so the import fails before any test runs.",
    "The server started and is listening on port 8080. The curl request returned HTTP 500, and the log "
    "shows a KeyError on 'user_id' in handlers.py line 42.",
    "The file was written. grep finds no remaining occurrences of the old API name.",
]
PLANS = [
    "Build the project and run the tests.",
    "Install the missing dependency, then rerun the failing test to confirm the fix.",
    "Open handlers.py around line 42, patch the lookup to use .get(), and restart the server.",
    "Check the output file and finish.",
]
COMMANDS = [
    ("ls -la\n", "0.1"),
    ("cd /app && make -j2\n", "10.0"),
    ("pip install -r requirements.txt && python -m pytest -q 2>&1 | tail -n 20\n", "15.0"),
    ("grep -rn 'old_api' src/ | head -20\n", "0.5"),
    (
        "cat > fix.py <<'EOF'\nimport sys\nif len(sys.argv) < 2 and 1 > 0:\n    sys.exit('usage: fix.py FILE')\nEOF\n",
        "0.1",
    ),
    ('sed -i \'s/data\\["user_id"\\]/data.get("user_id")/\' handlers.py && python3 handlers.py &\n', "1.0"),
    ("curl -s localhost:8080/health || echo down\n", "1.0"),
    ("C-c", "0.1"),
]


def typical_replies(count: int, seed: int = 0) -> list[str]:
    """Well-formed replies like a capable model's: 1-4 commands, some heredocs, some finished."""
    rng = random.Random(seed)
    replies = []
    for _ in range(count):
        keystrokes = "".join(
            f'<keystrokes duration="{duration}">{keys}</keystrokes>\n'
            for keys, duration in rng.sample(COMMANDS, rng.randint(1, 4))
        )
        done = "<task_complete>true</task_complete>\n" if rng.random() < 0.1 else ""
        replies.append(
            f"<response>\n<analysis>{rng.choice(ANALYSES)}</analysis>\n<plan>{rng.choice(PLANS)}</plan>\n"
            f"<commands>\n{keystrokes}</commands>\n{done}</response>"
        )
    return replies


def load_harbor(version: str) -> tuple[Callable[[str], object] | None, str]:
    """Harbor's parse function from its wheel (downloaded on demand), or None and the reason."""
    wheels = sorted(CACHE.glob(f"harbor-{version}-*.whl"))
    if not wheels:
        command = [
            sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--python-version", "3.12",
            "--only-binary=:all:", f"harbor=={version}", "-d", str(CACHE),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = sorted(CACHE.glob(f"harbor-{version}-*.whl"))
        if not wheels:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"could not download harbor=={version} with pip ({reason}); reporting ours alone"
    extracted = CACHE / f"harbor-{version}" / Path(HARBOR_MODULE).name
    if not extracted.exists():
        try:
            with zipfile.ZipFile(wheels[0]) as wheel:
                source = wheel.read(HARBOR_MODULE)
        except (KeyError, zipfile.BadZipFile) as exc:
            return None, f"{wheels[0].name} has no usable {HARBOR_MODULE}: {exc}"
        extracted.parent.mkdir(exist_ok=True)
        extracted.write_bytes(source)
    spec = importlib.util.spec_from_file_location("harbor_terminus_xml_plain_parser", extracted)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module.TerminusXMLPlainParser().parse_response, f"harbor {version} ({wheels[0].name})"


def replies_per_second(parse: Callable[[str], object], replies: list[str]) -> float:
    """Throughput in CPU time of this process, so that other jobs on a shared machine skew it less."""
    started = time.process_time()
    for text in replies:
        parse(text)
    return len(replies) / (time.process_time() - started)


def agreement(harbor_parse: Callable[[str], object], replies: list[str]) -> int:
    """How many replies get the same rejection, completion and commands from both parsers."""
    same = 0
    for text in replies:
        ours, theirs = parse_reply(text), harbor_parse(text)
        same += (
            ours.rejected == bool(theirs.error)
            and ours.task_complete == theirs.is_task_complete
            and [(c.keystrokes, c.duration) for c in ours.commands]
            == [(c.keystrokes, c.duration) for c in theirs.commands]
        )
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=2000, help="typical replies in the corpus")
    parser.add_argument("--rounds", type=int, default=7, help="timed passes per parser (best is reported)")
    parser.add_argument("--harbor-version", default="0.26.0")
    args = parser.parse_args(argv)

    replies = typical_replies(args.replies)
    size = sum(map(len, replies)) / len(replies)
    harbor_parse, harbor_note = load_harbor(args.harbor_version)
    print(f"corpus: {len(replies)} typical replies, {size:.0f} characters on average")
    print(f"baseline: {harbor_note}")
    ours_best = harbor_best = 0.0
    for _ in range(args.rounds):  # alternate the parsers so both see the same machine load
        ours_best = max(ours_best, replies_per_second(parse_reply, replies))
        if harbor_parse is not None:
            harbor_best = max(harbor_best, replies_per_second(harbor_parse, replies))
    print(f"{'parser':<14}{'replies/s':>12}{'us/reply':>10}")
    print(f"{'terminus-env':<14}{ours_best:>12,.0f}{1e6 / ours_best:>10.1f}")
    if harbor_parse is None:
        print("harbor        not measured (see baseline above)")
        return 0
    print(f"{'harbor':<14}{harbor_best:>12,.0f}{1e6 / harbor_best:>10.1f}")
    ratio = ours_best / harbor_best
    print(f"ratio: terminus-env is {ratio:.2f}x Harbor's speed (CPU time, best of {args.rounds} rounds each)")
    print(f"agreement on rejection, completion and commands: {agreement(harbor_parse, replies)}/{len(replies)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
