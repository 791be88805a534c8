"""The image's ENTRYPOINT runs on the agent's side, as the image's USER, with the keep-alive as its command; one
that exits or never hands over ends the start with its own output in the error."""

from __future__ import annotations

import asyncio
import os
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from sandbox_support import SPEC, Runner, containers_of_pid, remove_tags, run_fixture  # noqa: F401

from terminus_env import load_task
from terminus_env.rollout import OraclePolicy, RolloutRunner
from terminus_env.sandbox import Sandbox, SandboxError, SandboxSpec, ensure_image
from terminus_env.sandbox import sandbox as sandbox_module
from terminus_env.sandbox.channel import LOG_PREFIX

pytestmark = pytest.mark.docker


def none_left(wait_s: float = 15) -> bool:
    """No container of this process is left (Docker may still be finishing an auto-removal)."""
    deadline = time.monotonic() + wait_s
    while containers_of_pid(os.getpid()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.fixture(scope="module")
def client(docker_required: None) -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


@pytest.fixture
def image(client: docker.DockerClient, tmp_path: Path) -> Iterator:
    """Build an image from Dockerfile lines (and an entrypoint script); removed after the test."""
    tags: list[str] = []

    def build(name: str, dockerfile: str, entrypoint: str | None = None) -> str:
        context = tmp_path / name
        context.mkdir()
        (context / "Dockerfile").write_text(f"FROM {SPEC.image}\n" + textwrap.dedent(dockerfile))
        if entrypoint is not None:
            (context / "entrypoint.sh").write_text(textwrap.dedent(entrypoint))
        tags.append(ensure_image(context, f"sandbox-test-{name}-{os.getpid()}"))
        return tags[-1]

    yield build
    for tag in tags:
        client.images.remove(tag, force=True)


def test_an_entrypoint_can_write_etc_hosts_and_leave_a_server_running(run: Runner, image) -> None:
    tag = image(
        "entrypoint-service",
        """\
        COPY entrypoint.sh /usr/local/bin/entrypoint.sh
        ENTRYPOINT ["bash", "/usr/local/bin/entrypoint.sh"]
        """,
        """\
        echo "127.0.0.1 status.internal" >> /etc/hosts
        mkdir -p /srv/www && echo ready > /srv/www/state
        cd /srv/www && python3 -m http.server 8123 >/dev/null 2>&1 &
        exec "$@"
        """,
    )

    async def scenario() -> tuple[str, str]:
        async with await Sandbox.start(SandboxSpec(tag)) as sandbox:
            hosts = await sandbox.exec("getent hosts status.internal", 10)
            fetched = await sandbox.exec(
                "for i in $(seq 50); do curl -fs http://status.internal:8123/state && exit; sleep 0.1; done; exit 1", 20
            )
            return hosts.output, fetched.output

    hosts, fetched = run(scenario())
    assert hosts.split() == ["127.0.0.1", "status.internal"]
    assert fetched.strip() == "ready"


def test_a_server_the_entrypoint_starts_is_listening_when_the_agents_first_command_runs(run: Runner, image) -> None:
    """harbor-cookbook's dns-blacklisting starts its server in the background and hands over at once; its solution's
    first command queries that server. Harbor runs its own steps before the agent's first command; ours could run
    it before the server listened, and the correct solution earned 0. The start now waits until what the ENTRYPOINT
    left running is quiet (this server takes a second of CPU before it listens), so one try must connect."""
    tag = image(
        "entrypoint-slow-server",
        """\
        COPY entrypoint.sh /usr/local/bin/entrypoint.sh
        ENTRYPOINT ["bash", "/usr/local/bin/entrypoint.sh"]
        """,
        """\
        python3 -c '
        import socket, time
        started = time.process_time()
        while time.process_time() - started < 1.0:
            pass
        server = socket.create_server(("127.0.0.1", 8124))
        while True:
            server.accept()[0].close()
        ' &
        exec "$@"
        """,
    )

    async def scenario() -> str:
        async with await Sandbox.start(SandboxSpec(tag)) as sandbox:
            connect = "import socket; socket.create_connection(('127.0.0.1', 8124), 5); print('connected')"
            return (await sandbox.exec(f'python3 -c "{connect}" 2>&1', 20)).output

    assert run(scenario()).strip() == "connected"


def test_an_entrypoint_may_write_the_verifiers_folders_and_reaches_nothing_of_the_verifiers(
    run: Runner, image
) -> None:
    """As harbor-cookbook's dns-blacklisting does under `set -e` (`chmod 777 /logs /logs/verifier`): on the agent's
    side the verifier's folders are writable decoys of its own, still mount points, so the ENTRYPOINT runs as in a
    plain container and what it writes there never reaches the verifier."""
    tag = image(
        "entrypoint-logs",
        """\
        COPY entrypoint.sh /usr/local/bin/entrypoint.sh
        ENTRYPOINT ["bash", "/usr/local/bin/entrypoint.sh"]
        """,
        """\
        set -e
        mkdir -p /logs/verifier
        chmod 777 /logs /logs/verifier
        echo 1 > /logs/verifier/reward.txt
        echo planted > /tests/test_outputs.py
        exec "$@"
        """,
    )

    async def scenario():
        async with await Sandbox.start(SandboxSpec(tag)) as sandbox:
            agent = await sandbox.exec("cat /logs/verifier/reward.txt /tests/test_outputs.py; rmdir /logs/verifier", 10)
            run = await sandbox.verify(b"", "ls -A /logs/verifier /tests > /logs/verifier/listing", 30, user="root",
                                       read=("/logs/verifier/listing", "/logs/verifier/reward.txt"))  # fmt: skip
            return agent, run

    agent, verified = run(scenario())
    assert agent.output.split("\n")[:2] == ["1", "planted"] and "Device or resource busy" in agent.output
    assert verified.files["/logs/verifier/reward.txt"] is None  # the verifier's own folder: fresh and empty
    assert verified.files["/logs/verifier/listing"].decode().split() == ["/logs/verifier:", "listing", "/tests:"]


def test_an_entrypoint_that_exits_fails_the_start_with_its_output(run: Runner, image) -> None:
    tag = image(
        "entrypoint-exits",
        """\
        ENTRYPOINT ["sh", "-c", "echo loading /etc/app.conf; echo 'fatal: /etc/app.conf not found' >&2; exit 3", "--"]
        """,
    )
    with pytest.raises(SandboxError) as failure:
        run(Sandbox.start(SandboxSpec(tag)))
    message = str(failure.value)
    assert "ended before starting the keep-alive command (exit code 3)" in message
    lines = message.splitlines()  # stdout and stderr, in whichever order the log interleaved them
    assert "loading /etc/app.conf" in lines and "fatal: /etc/app.conf not found" in lines
    assert LOG_PREFIX not in message  # the container's own lines are not the entrypoint's output
    assert none_left()


def test_an_entrypoint_that_never_hands_over_fails_the_start_in_time(
    run: Runner, image, monkeypatch: pytest.MonkeyPatch
) -> None:
    tag = image(
        "entrypoint-hangs",
        """\
        ENTRYPOINT ["sh", "-c", "echo waiting for a database that never comes; sleep 600", "--"]
        """,
    )
    monkeypatch.setattr(sandbox_module, "HANDOVER_S", 3.0)
    with pytest.raises(SandboxError) as failure:
        run(asyncio.wait_for(Sandbox.start(SandboxSpec(tag)), 60))
    message = str(failure.value)
    assert "did not start the keep-alive command within 3 s" in message
    assert "waiting for a database that never comes" in message
    assert none_left()


def test_the_entrypoint_runs_as_the_images_user(run: Runner, image) -> None:
    tag = image(
        "entrypoint-user",
        """\
        RUN useradd -m app
        COPY entrypoint.sh /usr/local/bin/entrypoint.sh
        USER app
        ENTRYPOINT ["bash", "/usr/local/bin/entrypoint.sh"]
        """,
        """\
        echo "$(id -un) $HOME" > /tmp/entrypoint-ran-as
        exec "$@"
        """,
    )

    async def scenario() -> tuple[str, str]:
        async with await Sandbox.start(SandboxSpec(tag)) as sandbox:
            ran_as = await sandbox.read_file("/tmp/entrypoint-ran-as")
            whoami = await sandbox.exec("id -un", 10)  # the terminal's and exec's default user: the image's
            return (ran_as or b"").decode(), whoami.output

    ran_as, whoami = run(scenario())
    assert ran_as.split() == ["app", "/home/app"]
    assert whoami.strip() == "app"


def test_a_failing_entrypoint_is_an_env_error_with_its_output(tmp_path: Path, client: docker.DockerClient) -> None:
    task_dir = tmp_path / f"broken-entrypoint-{os.getpid()}"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "task.toml").write_text('version = "1.0"\n[environment]\nallow_internet = false\n')
    (task_dir / "instruction.md").write_text("Nothing to do.\n")
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment" / "Dockerfile").write_text(
        f"FROM {SPEC.image}\nENTRYPOINT [\"sh\", \"-c\", \"echo 'license key missing' >&2; exit 7\", \"--\"]\n"
    )
    task = load_task(task_dir)
    runner = RolloutRunner(OraclePolicy(), env_kwargs={"mode": "eval"})
    try:
        (trajectory,) = asyncio.run(runner.run([task]))
    finally:
        remove_tags(client, f"terminus-env/task-{task_dir.name}")
    assert trajectory.masked and trajectory.reward == 0.0
    assert trajectory.error and "exit code 7" in trajectory.error and "license key missing" in trajectory.error


def test_the_host_and_the_container_agree_on_names() -> None:
    from terminus_env.sandbox import channel, sandbox
    from terminus_env.sandbox.inside import names

    assert (channel.LOG_PREFIX, channel.CHANNEL_SOCKET) == (names.LOG_PREFIX, names.CHANNEL_SOCKET)
    assert channel.CHANNEL_DIR == names.CHANNEL_DIR
    assert (channel.Route.DIRECT.value, channel.Route.RELAY.value) == (names.DIRECT, names.RELAY)
    assert [word.value for word in sandbox.Network] == [names.HOSTS, names.CUT_OFF, names.AS_IS]


@pytest.mark.parametrize("magic, runs", [(None, "compiled"), (b"\x00\x00\r\n", "source")])
def test_the_main_process_runs_compiled_code_only_where_the_bytecode_matches(magic: bytes | None, runs: str) -> None:
    """An image's Python of another minor version has another bytecode magic: it compiles the source instead.
    Either way both variables leave the environment before anything of the task can inherit it."""
    import importlib.util
    import subprocess
    import sys

    from terminus_env.sandbox import shipping

    program = (
        "import os, sys\n"
        "left = sorted(name for name in os.environ if name.startswith('TERMINUS_SANDBOX'))\n"
        "print({!r}, sys.argv[1:], left)\n"
    )
    source = shipping.code_variables(program.format("source"))
    compiled = shipping.code_variables(program.format("compiled"), magic or importlib.util.MAGIC_NUMBER)
    variables = {
        **{name: value for name, value in source.items() if name.startswith(shipping.SOURCE_VARIABLE)},
        **{name: value for name, value in compiled.items() if name.startswith(shipping.COMPILED_VARIABLE)},
    }
    command = [sys.executable, *shipping.MAIN_COMMAND[1:], "x"]
    result = subprocess.run(command, env=variables, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == f"{runs} ['main', 'x'] []"
