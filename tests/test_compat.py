"""The compatibility suite (tests/compat): tasks written in the shapes real Terminal-Bench 1 and Harbor tasks use,
run as their authors wrote them, over real Docker. Each runnable one passes Terminal-Bench's validity checks (the
oracle earns 1, doing nothing earns 0); the multi-step one is refused by name. Then what the checks alone do not
show: sidecars are hardened, reachable by name, waited for, and removed with the episode, even after a crash."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sandbox_support import remove_tags

from terminus_env.cli.check import check_task
from terminus_env.sandbox import ImageBuildError, Sandbox, SandboxError, reap
from terminus_env.sandbox.owner import LABEL, PID_LABEL, RUN_LABEL
from terminus_env.sandbox.services import SERVICE_LABEL
from terminus_env.tasks import TaskError, load_task, task_image

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parent.parent
COMPAT = Path(__file__).resolve().parent / "compat"
RUNNABLE = [
    "compose-sidecar", "compose-yml-data", "entrypoint-service", "env-templates", "harbor-newer-fields",
    "prebuilt-image", "tb1-client-folder", "tb1-multi-service",
]  # fmt: skip
REFUSED = {"multi-step-refused": "multi-step tasks are not supported"}
HOST_VARIABLES = {"COMPAT_DEPLOY_TOKEN": "tok-5f3a9c"}  # what env-templates asks the host for


@pytest.fixture(autouse=True)
def host_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in HOST_VARIABLES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("COMPAT_DEPLOY_REGION", raising=False)


@pytest.fixture(scope="module")
def client(docker_required: None) -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


def owned(client: docker.DockerClient, pid: int) -> tuple[list[str], list[str]]:
    """The containers and networks that process ``pid`` owns."""
    labels = [LABEL, f"{PID_LABEL}={pid}"]
    containers = [c["Id"] for c in client.api.containers(all=True, filters={"label": labels})]
    networks = [n["Name"] for n in client.api.networks(filters={"label": labels})]
    return containers, networks


def nothing_left(client: docker.DockerClient, pid: int, wait_s: float = 20) -> bool:
    deadline = time.monotonic() + wait_s
    while owned(client, pid) != ([], []):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_the_suite_is_all_accounted_for() -> None:
    assert sorted(p.name for p in COMPAT.iterdir() if p.is_dir()) == sorted([*RUNNABLE, *REFUSED])


@pytest.mark.parametrize("name", RUNNABLE)
def test_oracle_earns_1_and_doing_nothing_earns_0(name: str, client: docker.DockerClient) -> None:
    outcomes = asyncio.run(check_task(COMPAT / name, lambda _: None))
    rewards = {o.check: o.reward for o in outcomes}
    assert rewards == {"nop": 0.0, "oracle": 1.0, "train-nop": 0.0, "train-oracle": 1.0}, [
        o.detail for o in outcomes if not o.passed
    ]
    assert all(o.passed for o in outcomes), [o.detail for o in outcomes if not o.passed]
    assert nothing_left(client, os.getpid())


@pytest.mark.parametrize("name", RUNNABLE)
def test_the_shell_the_oracle_and_the_verifier_start_in_the_images_workdir(
    name: str, client: docker.DockerClient
) -> None:
    """Harbor starts the agent's shell, the oracle and the verifier with `docker exec` and no working folder: in
    the image's WORKDIR, unless the task names one. Every compatibility solution writes to a relative path, so a
    start anywhere else fails its oracle; here the three are asked directly, and the first prompt shows it."""
    task = load_task(COMPAT / name)

    async def scenario() -> tuple[str, str, str, str, str]:
        image = await task_image(task)
        expected = task.workdir or client.api.inspect_image(image)["Config"]["WorkingDir"] or "/"
        sandbox = await Sandbox.start(task.sandbox_spec(image))
        try:
            first = await sandbox.terminal.screen()
            await sandbox.terminal.send("pwd\n", 5)
            shell = (await sandbox.terminal.capture_new()).text
            oracle = (await sandbox.exec("pwd", 10)).output.strip()
            verifier = (await sandbox.verify(b"", "pwd", 10, user="root")).result.output.strip()
            return expected, first, shell, oracle, verifier
        finally:
            await sandbox.close()

    expected, first, shell, oracle, verifier = asyncio.run(scenario())
    assert expected not in ("", "/"), "each compatibility image sets a WORKDIR"
    assert re.search(f":{re.escape(expected)}[#$]", first) and f"\n{expected}\n" in shell, (first, shell)
    assert oracle == verifier == expected


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_cannot_run_is_refused_by_name(name: str) -> None:
    with pytest.raises(TaskError, match=REFUSED[name]) as refusal:
        load_task(COMPAT / name)
    assert "instruction.md" not in str(refusal.value)


def test_a_template_without_its_host_variable_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COMPAT_DEPLOY_TOKEN")
    with pytest.raises(TaskError, match=r"environment\.env\.DEPLOY_TOKEN.*\$\{COMPAT_DEPLOY_TOKEN\} is not set"):
        load_task(COMPAT / "env-templates")
    monkeypatch.setenv("COMPAT_DEPLOY_TOKEN", "t")
    monkeypatch.setenv("COMPAT_DEPLOY_REGION", "ap-south-2")
    task = load_task(COMPAT / "env-templates")
    assert task.env["DEPLOY_TARGET"] == "deploy-ap-south-2.internal" and task.verifier_env["EXPECTED_TOKEN"] == "t"


@pytest.fixture
def host_listener() -> Iterator[int]:
    """A TCP server on every address of this host: what a container cut off the host must not reach."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            connection.sendall(b"host service\n")
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def host_addresses(client: docker.DockerClient, network: dict) -> list[str]:
    """The episode network's gateway, the default bridge's, and this host's outward address."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outward interface
    outward = probe.getsockname()[0]
    probe.close()
    bridge = client.api.inspect_network("bridge")
    gateways = [config["Gateway"] for n in (network, bridge) for config in n["IPAM"]["Config"] if "Gateway" in config]
    return [*gateways, outward]


CONNECT = (
    "python3 -c 'import errno, socket\n"
    "try: print(socket.create_connection((\"{address}\", {port}), 3).recv(64).decode())\n"
    "except OSError as exc: print(errno.errorcode.get(exc.errno, exc))'"
)


def test_sidecars_are_hardened_reachable_waited_for_and_removed(client: docker.DockerClient, host_listener: int) -> None:  # noqa: E501
    task = load_task(COMPAT / "compose-sidecar")
    assert socket.create_connection(("127.0.0.1", host_listener), 5).recv(64) == b"host service\n"

    async def scenario() -> tuple[dict, dict, dict, str, str, dict[str, str]]:
        spec = task.sandbox_spec(await task_image(task))
        async with await Sandbox.start(spec) as sandbox:
            main = client.api.inspect_container(sandbox.id)
            run = main["Config"]["Labels"][RUN_LABEL]
            (found,) = client.api.containers(filters={"label": [f"{RUN_LABEL}={run}", f"{SERVICE_LABEL}=tickets"]})
            sidecar = client.api.inspect_container(found["Id"])
            network = client.api.inspect_network(f"terminus-env-{run}")
            resolved = await sandbox.exec("getent hosts tickets", 10)  # from the agent's side
            fetched = await sandbox.exec('curl -fsS "$TICKETS_URL/health"', 10)
            host = {
                address: (await sandbox.exec(CONNECT.format(address=address, port=host_listener), 10)).output.strip()
                for address in host_addresses(client, network)
            }
            return main, sidecar, network, resolved.output, fetched.output, host

    main, sidecar, network, resolved, fetched, host = asyncio.run(scenario())
    for address, answer in host.items():  # no way to the host, whichever of its addresses the agent tries
        assert answer in ("EHOSTUNREACH", "ENETUNREACH"), (address, answer)
    host = sidecar["HostConfig"]
    assert "no-new-privileges" in host["SecurityOpt"] and host["CapDrop"] == ["ALL"]
    assert not {"NET_RAW", "MKNOD", "SYS_ADMIN", "SYS_CHROOT"} & set(host["CapAdd"])
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"]) == (256 << 20, 500_000_000, 1024)
    assert host["LogConfig"]["Config"]["max-size"] == "1m" and not host["Privileged"]
    assert sidecar["Config"]["Labels"][PID_LABEL] == str(os.getpid())
    assert network["Internal"] is True  # the task does not allow the internet: no route out
    assert set(network["Containers"]) == {main["Id"], sidecar["Id"]}
    assert resolved.split()[1] == "tickets" and '"ok": true' in fetched
    healthy_at = min(entry["End"] for entry in sidecar["State"]["Health"]["Log"] if entry["ExitCode"] == 0)
    assert main["State"]["StartedAt"] > healthy_at  # depends_on: service_healthy held before the main one started
    assert nothing_left(client, os.getpid())


_CRASHING_OWNER = textwrap.dedent(
    """
    import asyncio, sys
    from terminus_env.sandbox import Sandbox
    from terminus_env.tasks import load_task, task_image

    async def main():
        task = load_task(sys.argv[1])
        sandbox = await Sandbox.start(task.sandbox_spec(await task_image(task)))
        print(sandbox.id, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_an_owner_that_dies_leaves_no_sidecar_or_network(client: docker.DockerClient, ending: int) -> None:
    """SIGTERM: the exit hooks remove everything. SIGKILL: the agent's container ends itself, and the reaper
    removes the sidecars and the network."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_OWNER, str(COMPAT / "tb1-multi-service")], stdout=subprocess.PIPE, text=True,
        cwd=REPO,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline().strip()
        containers, networks = owned(client, child.pid)
        assert len(containers) == 3 and len(networks) == 1  # the client, two sidecars, their network
    finally:
        child.send_signal(ending)
        child.wait(timeout=60)
    deadline = time.monotonic() + 20
    while owned(client, child.pid) != ([], []) and time.monotonic() < deadline:
        if ending == signal.SIGKILL:
            reap(client=client)  # again: the network goes once the containers' removal has finished
        time.sleep(0.5)
    assert owned(client, child.pid) == ([], [])


def _compose_task(root: Path, sidecar: str) -> Path:
    """A Harbor task whose main service waits for one sidecar (described by ``sidecar``, compose YAML)."""
    folder = root / f"broken-sidecar-{os.getpid()}"
    (folder / "environment" / "svc").mkdir(parents=True)
    (folder / "tests").mkdir()
    (folder / "task.toml").write_text('version = "1.0"\n[environment]\nallow_internet = false\n')
    (folder / "instruction.md").write_text("Nothing to do.\n")
    (folder / "tests" / "test.sh").write_text("echo 0 > /logs/verifier/reward.txt\n")
    (folder / "environment" / "Dockerfile").write_text("FROM terminus-env/base:bookworm\n")
    (folder / "environment" / "svc" / "Dockerfile").write_text("FROM terminus-env/base:bookworm\n")
    (folder / "environment" / "docker-compose.yaml").write_text(textwrap.dedent(sidecar))
    return folder


@pytest.mark.parametrize(
    ("sidecar", "expected"),
    [
        (
            """\
            services:
              main:
                depends_on:
                  svc: {condition: service_completed_successfully}
              svc:
                build: ./svc
                command: ["sh", "-c", "echo 'cannot open /data/db: no such file' >&2; exit 4"]
            """,
            r"service 'svc' exited with code 4(.|\n)*cannot open /data/db: no such file",
        ),
        (
            """\
            services:
              main:
                depends_on:
                  svc: {condition: service_healthy}
              svc:
                build: ./svc
                command: ["sleep", "600"]
                healthcheck:
                  test: ["CMD-SHELL", "echo port 5432 closed; exit 1"]
                  interval: 200ms
                  retries: 2
            """,
            r"service 'svc' is unhealthy \(its last check exited 1: port 5432 closed\)",
        ),
    ],
    ids=["exits", "unhealthy"],  # (a service that dies at once may look started first: compose waits no longer)
)
def test_a_failing_sidecar_fails_the_start_with_its_output(
    sidecar: str, expected: str, tmp_path: Path, client: docker.DockerClient
) -> None:
    task = load_task(_compose_task(tmp_path, sidecar))

    async def scenario() -> None:
        async with await Sandbox.start(task.sandbox_spec(await task_image(task))):
            pass

    try:
        with pytest.raises(SandboxError, match=expected):
            asyncio.run(scenario())
        assert nothing_left(client, os.getpid())
    finally:
        remove_tags(client, f"terminus-env/task-broken-sidecar-{os.getpid()}")


def test_a_prebuilt_image_is_used_when_present(tmp_path: Path, client: docker.DockerClient) -> None:
    fallback = load_task(COMPAT / "prebuilt-image")
    built = asyncio.run(task_image(fallback))  # absent and not pullable here: the Dockerfile was built instead
    assert built.startswith("terminus-env/task-prebuilt-image:")
    tag = f"terminus-env/compat-prebuilt-test:{os.getpid()}-{time.time_ns()}"
    client.images.build(
        fileobj=__import__("io").BytesIO(f"FROM {built}\nRUN touch /etc/prebuilt-marker\n".encode()), tag=tag, rm=True
    )
    copy = shutil.copytree(COMPAT / "prebuilt-image", tmp_path / "prebuilt-image")
    toml = copy / "task.toml"
    toml.write_text(toml.read_text().replace("terminus-env/compat-prebuilt-image:1.0", tag))
    try:
        task = load_task(copy)
        assert asyncio.run(task_image(task)) == tag
        outcomes = asyncio.run(check_task(copy, lambda _: None))
        expected = {"nop": 0.0, "oracle": 1.0, "train-nop": 0.0, "train-oracle": 1.0}
        assert {o.check: o.reward for o in outcomes} == expected

        async def marker() -> bytes | None:
            async with await Sandbox.start(task.sandbox_spec(tag)) as sandbox:
                return await sandbox.read_file("/etc/prebuilt-marker")

        assert asyncio.run(marker()) == b""  # the prebuilt image ran, not the Dockerfile's
        (copy / "environment" / "Dockerfile").unlink()
        missing = dataclasses.replace(load_task(copy), docker_image=tag + "-missing")
        with pytest.raises(ImageBuildError, match=r"prebuilt image .*-missing' is not here and cannot be pulled"):
            asyncio.run(task_image(missing))
    finally:
        client.images.remove(tag, force=True)
