"""The container: hardening, limits, exec, files, close, pool, reaper, images, and no engine."""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
import requests
from require import REQUIRE_DOCKER
from sandbox_support import SPEC, Runner, containers_of_pid, run_fixture, sandbox_fixture, sandbox_on  # noqa: F401

from terminus_env import config
from terminus_env.config import ConfigError
from terminus_env.sandbox import (
    DockerUnavailable,
    ImageBuildError,
    Sandbox,
    SandboxError,
    SandboxLost,
    SandboxPool,
    SandboxSpec,
    ensure_image,
    reap,
)
from terminus_env.sandbox import channel as channel_module
from terminus_env.sandbox.channel import (
    CHANNEL_DIR,
    CHANNEL_SOCKET,
    ChannelFolder,
    Route,
    channel_route,
    folder_root,
)
from terminus_env.sandbox.owner import Owner

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def limited(run: Runner) -> Iterator[Sandbox]:
    yield from sandbox_on(run, SandboxSpec(SPEC.image, cpus=0.5, memory_mb=96, pids_limit=64))


def routed(run: Runner, route: Route) -> Iterator[Sandbox]:
    """A sandbox whose channel takes ``route``. DIRECT needs a local engine this process shares a folder with:
    where there is none, the DIRECT tests skip, unless TERMINUS_REQUIRE_DOCKER asks for every Docker test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(config.SANDBOX_CHANNEL, route.value)
        try:
            sandbox = run(Sandbox.start(SPEC))
        except ConfigError as exc:
            if config.env_flag(REQUIRE_DOCKER, False):
                raise
            pytest.skip(str(exc))
    try:
        assert sandbox._channel.route is route
        yield sandbox
    finally:
        run(sandbox.close())


@pytest.fixture(scope="module")
def direct(run: Runner) -> Iterator[Sandbox]:
    yield from routed(run, Route.DIRECT)


@pytest.fixture(scope="module", params=list(Route), ids=[route.value for route in Route])
def either(run: Runner, request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    """A sandbox reached directly, then one reached through the relay."""
    yield from routed(run, request.param)


@pytest.fixture(scope="module")
def client(docker_required: None) -> Iterator[docker.DockerClient]:
    client = docker.from_env()
    yield client
    client.close()


def sh(run: Runner, sandbox: Sandbox, cmd: str, timeout: float = 10, **kwargs: object):
    return run(sandbox.exec(cmd, timeout, **kwargs))


# --- hardening ---------------------------------------------------------------------------------


def test_capabilities_allow_chown_and_package_tools_but_not_mknod_or_raw_sockets(run: Runner, sandbox: Sandbox) -> None:
    assert sh(run, sandbox, "touch /tmp/f && chown nobody:nogroup /tmp/f && stat -c %U /tmp/f").output == "nobody\n"
    assert sh(run, sandbox, "setpriv --reuid=65534 --regid=65534 --clear-groups id -u").output.strip() == "65534"
    assert sh(run, sandbox, "mknod /tmp/null c 1 3").exit_code != 0
    raw = "import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)"
    result = sh(run, sandbox, f"python3 -c '{raw}'")
    assert result.exit_code != 0 and "PermissionError" in result.output


def test_no_new_privileges_and_init(run: Runner, sandbox: Sandbox, client: docker.DockerClient) -> None:
    assert "NoNewPrivs:\t1" in sh(run, sandbox, "grep NoNewPrivs /proc/self/status").output
    assert client.api.inspect_container(sandbox.id)["HostConfig"]["Init"] is True
    # The verifier's PID namespace has an init of its own: neither Docker's init nor the daemon is in its sight.
    seen = run(sandbox.verify(b"", "cat /proc/[0-9]*/comm | sort -u", 10, user="root")).result.output.split()
    assert "docker-init" not in seen and "tini" not in seen and "sleep" in seen


def test_no_network_by_default(run: Runner, sandbox: Sandbox) -> None:
    assert sh(run, sandbox, "ls /sys/class/net").output.split() == ["lo"]
    probe = "import socket; socket.create_connection(('1.1.1.1', 53), 2)"
    assert sh(run, sandbox, f'python3 -c "{probe}"').exit_code != 0


def test_localhost_resolves_without_a_network(run: Runner, sandbox: Sandbox) -> None:
    """A container with its network disabled gets an empty /etc/hosts from Docker; the main process writes the
    one ``--network none`` has, so `localhost` resolves and the loopback device carries traffic."""
    hosts = sh(run, sandbox, "cat /etc/hosts").output
    assert hosts.startswith("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    assert "localhost" in sh(run, sandbox, "getent hosts localhost").output
    assert sh(run, sandbox, "stat -c %a /etc/hosts").output.strip() == "644"
    serve = "import socket; s = socket.create_server(('localhost', 0)); socket.create_connection(s.getsockname())"
    assert sh(run, sandbox, f'python3 -c "{serve}"').exit_code == 0


def test_allow_internet_gives_a_network_interface(run: Runner) -> None:
    for sandbox in sandbox_on(run, SandboxSpec(SPEC.image, allow_internet=True)):
        assert "eth0" in sh(run, sandbox, "ls /sys/class/net").output.split()


def test_limits_and_labels_are_set(run: Runner, limited: Sandbox, client: docker.DockerClient) -> None:
    attrs = client.api.inspect_container(limited.id)
    host = attrs["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == 96 * 1024 * 1024
    assert host["NanoCpus"] == 500_000_000 and host["PidsLimit"] == 64
    assert host["Init"] is True and attrs["Config"]["NetworkDisabled"] is True  # loopback only, see below
    assert not attrs["NetworkSettings"]["Networks"]
    assert "no-new-privileges" in host["SecurityOpt"]
    assert set(host["CapDrop"]) == {"ALL"} and "CHOWN" in host["CapAdd"] and "NET_RAW" not in host["CapAdd"]
    owner = Owner.from_labels(attrs["Config"]["Labels"])
    assert owner is not None and owner.pid == os.getpid() and owner.alive()


def test_fork_bomb_is_held_by_the_pids_limit(run: Runner, limited: Sandbox) -> None:
    result = sh(run, limited, "bomb() { bomb | bomb & }; bomb; sleep 5", timeout=4)
    assert result.timed_out and result.exit_code == 124
    count = sh(run, limited, "ls -d /proc/[0-9]* | wc -l", timeout=10)
    assert count.exit_code == 0 and int(count.output) < 20, "the bomb should be gone after the timeout"


def test_memory_hog_is_killed_and_the_sandbox_lives_on(run: Runner, limited: Sandbox) -> None:
    result = sh(run, limited, "python3 -c 'x = bytearray(400 * 1024 * 1024); print(len(x))'", timeout=30)
    assert result.exit_code in (137, 1) and "419430400" not in result.output
    assert sh(run, limited, "echo alive").output == "alive\n"
    run(limited.terminal.send("echo terminal-alive\n", 5))
    assert "terminal-alive" in run(limited.terminal.capture_new()).text


def test_a_paused_container_is_an_unanswered_request_not_a_lost_one(run: Runner, client: docker.DockerClient) -> None:
    for sandbox in sandbox_on(run):
        client.api.pause(sandbox.id)
        try:
            with pytest.raises(SandboxError, match="did not answer") as error:
                run(sandbox._channel.request("ping", 1.0))
            assert not isinstance(error.value, SandboxLost)
        finally:
            client.api.unpause(sandbox.id)
        assert sandbox.alive and run(sandbox.exec("echo back", 10)).output == "back\n"


def test_the_daemon_is_out_of_the_verifiers_sight_and_not_dumpable(
    run: Runner, sandbox: Sandbox, client: docker.DockerClient
) -> None:
    """The verifier cannot even find the daemon; and in the container's first namespaces, where it lives, a process
    without CAP_SYS_PTRACE cannot open its /proc entries."""
    probe = "pgrep terminus-; echo found=$?"
    assert run(sandbox.verify(b"", probe, 10, user="root")).result.output.split() == ["found=1"]
    found = "$(pgrep -x terminus-daemon) $(pgrep -x terminus-relay)"
    probe = f"for p in {found}; do cat /proc/$p/environ >/dev/null 2>&1 && echo y || echo no; done"
    drop = ["setpriv", "--bounding-set=-sys_admin,-sys_chroot,-setpcap,-net_admin", "bash", "-c", probe]
    result = client.containers.get(sandbox.id).exec_run(drop, user="0")
    relays = 1 if sandbox._channel.route is Route.RELAY else 0
    assert result.output.decode().split() == ["no"] * (1 + relays), result.output


@pytest.mark.parametrize("path", [CHANNEL_SOCKET, CHANNEL_DIR + "/channel"], ids=["relay-socket", "direct-socket"])
def test_the_daemons_channel_socket_is_out_of_reach(
    run: Runner, either: Sandbox, client: docker.DockerClient, path: str
) -> None:
    """Connect to where the daemon waits for the host, to pose as it: the agent's and the verifier's sides have
    their own /run/terminus and a read-only empty /run/terminus-channel, and the daemon removed its socket once
    the host connected."""
    probe = (
        f"import socket\ntry:\n    socket.socket(socket.AF_UNIX).connect({path!r})\n    print('connected')\n"
        "except OSError as exc:\n    print(type(exc).__name__)\n"
    )
    command = "python3 -c " + shlex.quote(probe)
    assert sh(run, either, command).output.strip() == "FileNotFoundError"
    assert run(either.verify(b"", command, 10, user="root")).result.output.strip() == "FileNotFoundError"
    host_side = ["python3", "-c", probe]
    assert client.containers.get(either.id).exec_run(host_side, user="0").output.strip() == b"FileNotFoundError"


def test_the_daemon_and_the_relay_are_out_of_sight_on_either_route(
    run: Runner, either: Sandbox, client: docker.DockerClient
) -> None:
    """The same look for the daemon's (and the relay's) name from the agent's and the verifier's sides, on both
    routes; and the host's side finds exactly the processes the route has."""
    probe = "pgrep terminus-; echo found=$?"
    assert sh(run, either, probe).output.split() == ["found=1"]
    assert run(either.verify(b"", probe, 10, user="root")).result.output.split() == ["found=1"]
    names = client.containers.get(either.id).exec_run(["pgrep", "-l", "terminus-"], user="0").output.decode()
    expected = {"terminus-daemon"} | ({"terminus-relay"} if either._channel.route is Route.RELAY else set())
    assert {line.split()[1] for line in names.splitlines()} == expected, names


def test_the_containers_unix_sockets_name_nothing_of_the_host(run: Runner, direct: Sandbox) -> None:
    """/proc/net/unix lists the sockets of the container's network namespace, the host's end of the direct channel
    among them (the kernel makes the accepted socket in the connecting side's namespace, under the listener's
    name): that name says nothing of the host's folders or of its owner's pid."""
    listed = sh(run, direct, "cat /proc/net/unix").output
    assert "/proc/self/fd/" in listed and "terminus-env" not in listed and f"/{os.getpid()}-" not in listed, listed


def test_the_channel_folder_holds_nothing_and_takes_nothing(run: Runner, direct: Sandbox) -> None:
    """On the DIRECT route the channel's folder is the host machine's (on its /run): were it writable from the
    agent's or the verifier's side, a loop could fill the host's memory; were it removable, the agent could
    detach the mount. Both sides have it as a read-only empty mount point of their own."""
    attack = (
        "ls -A /run/terminus-channel | wc -l; touch /run/terminus-channel/x 2>/dev/null; echo write=$?; "
        "rmdir /run/terminus-channel 2>/dev/null; echo rmdir=$?; mv /run/terminus-channel /tmp/c 2>/dev/null; "
        "echo rename=$?"
    )
    agent = sh(run, direct, attack).output.split()
    verifier = run(direct.verify(b"", attack, 10, user="root")).result.output.split()
    assert agent == verifier == ["0", "write=1", "rmdir=1", "rename=1"], (agent, verifier)
    folder = direct._channel._folder
    assert folder is not None and list(folder.path.iterdir()) == []  # the socket went once the host connected


def test_files_copy_into_a_sandbox_on_either_route(run: Runner, either: Sandbox, tmp_path: Path) -> None:
    """Docker copies into a container only while every mount's source exists: the DIRECT channel's folder stays
    as long as the container (removing it once connected broke every copy)."""
    (tmp_path / "a.txt").write_text("copied\n")
    run(either.put_dir(tmp_path, "/copied"))
    assert sh(run, either, "cat /copied/a.txt").output == "copied\n"
    step = run(either.terminal.step([("echo stepped\n", 1.0)]))
    assert "stepped" in step.output.text


def test_the_channel_folder_goes_with_the_sandbox(run: Runner) -> None:
    for sandbox in routed(run, Route.DIRECT):
        folder = sandbox._channel._folder
        assert folder is not None and folder.path.is_dir() and folder.path.parent == folder_root()
        assert oct(folder.path.stat().st_mode & 0o777) == "0o700"
    assert not folder.path.exists()


# --- exec and files ----------------------------------------------------------------------------


def test_exec_reports_exit_code_and_both_streams(run: Runner, sandbox: Sandbox) -> None:
    result = sh(run, sandbox, "echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.output, result.timed_out) == (3, "out\nerr\n", False)


def test_exec_user_env_and_workdir(run: Runner, sandbox: Sandbox) -> None:
    assert sh(run, sandbox, "id -un", user="nobody").output == "nobody\n"
    assert sh(run, sandbox, "echo $GREETING", env={"GREETING": "hello"}).output == "hello\n"
    assert sh(run, sandbox, "pwd", workdir="/usr").output == "/usr\n"


def test_exec_timeout_kills_everything_it_started(run: Runner, sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sh(run, sandbox, "sleep 987 & sleep 986 | cat", timeout=1)
    assert result.timed_out and result.exit_code == 124
    assert time.monotonic() - started < 8
    assert sh(run, sandbox, "pgrep -f 'slee[p] 98[67]'").exit_code == 1


def test_exec_output_is_capped(run: Runner, sandbox: Sandbox) -> None:
    result = sh(run, sandbox, "head -c 3000000 /dev/zero | tr '\\0' y; echo; echo END", timeout=30)
    assert result.output.endswith("END\n") and result.output.startswith("yyyy")
    assert "interior bytes omitted" in result.output and len(result.output) < 1_100_000


def test_put_dir_put_file_and_read_file(run: Runner, sandbox: Sandbox, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "run.sh").write_text("echo ran\n")
    (tmp_path / "sub" / "run.sh").chmod(0o755)
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    run(sandbox.put_dir(tmp_path, "/opt/new/place"))
    assert run(sandbox.read_file("/opt/new/place/data.bin")) == bytes(range(256))
    assert sh(run, sandbox, "/opt/new/place/sub/run.sh").output == "ran\n"
    run(sandbox.put_file(b"#!/bin/sh\necho x\n", "/deep/er/tool", mode=0o750))
    assert sh(run, sandbox, "stat -c %a /deep/er/tool").output == "750\n"
    assert run(sandbox.read_file("/deep/er/tool", max_bytes=4)) == b"#!/b"
    assert run(sandbox.read_file("/no/such/file")) is None


def test_put_dir_of_a_missing_folder_is_a_clear_error(run: Runner, sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="not a folder"):
        run(sandbox.put_dir(tmp_path / "missing", "/x"))


def test_missing_image_is_a_clear_error(run: Runner) -> None:
    with pytest.raises(SandboxError, match="does not exist here"):
        run(Sandbox.start(SandboxSpec("terminus-env/no-such-image:never")))


# --- lifecycle ---------------------------------------------------------------------------------


def test_a_burst_of_starts_loses_no_daemon_while_the_wait_for_it_times_out_at_once(
    run: Runner, client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every start of a burst succeeds while the host's wait for each daemon's connection times out every 0.1 ms,
    so that connections keep arriving as a wait ends (a connection lost there fails its start 75 s later)."""
    monkeypatch.setattr(channel_module, "ACCEPT_POLL_S", 1e-4)
    monkeypatch.setenv(config.SANDBOX_CHANNEL, Route.DIRECT.value)

    try:
        channel_route(client, client.info())
    except ConfigError as exc:  # no local engine shares a folder with this process: no DIRECT route to race
        if config.env_flag(REQUIRE_DOCKER, False):
            raise
        pytest.skip(str(exc))

    async def burst() -> list[Sandbox | BaseException]:
        started = await asyncio.gather(*(Sandbox.start(SPEC) for _ in range(16)), return_exceptions=True)
        await asyncio.gather(*(s.close() for s in started if isinstance(s, Sandbox)))
        return started

    started = run(burst())
    assert [s for s in started if not isinstance(s, Sandbox)] == []


def test_close_is_idempotent_and_removes_the_container(run: Runner, client: docker.DockerClient) -> None:
    sandbox = run(Sandbox.start(SPEC))
    run(sandbox.close())
    run(sandbox.close())
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(sandbox.id)


def test_pool_gives_warm_sandboxes_and_removes_everything(run: Runner, client: docker.DockerClient) -> None:
    async def scenario() -> tuple[list[str], int]:
        async with SandboxPool(warm_per_spec=1) as pool:
            first = await pool.acquire(SPEC)
            await pool.wait_warm()
            assert pool.warm_count(SPEC) == 1
            await pool.release(first)
            second = await pool.acquire(SPEC)  # the warm one
            await second.terminal.send("echo from-pool\n", 5)
            assert "from-pool" in (await second.terminal.capture_new()).text
            await pool.wait_warm()
            return [first.id, second.id], pool.warm_count(SPEC)

    ids, warm = run(scenario())
    assert ids[0] != ids[1] and warm == 1
    assert not set(ids) & set(containers_of_pid(os.getpid()))


def test_pool_caps_its_warm_sandboxes_and_the_latest_spec_takes_the_place(
    run: Runner, client: docker.DockerClient
) -> None:
    other = SandboxSpec(SPEC.image, memory_mb=1024)

    async def scenario() -> tuple[list[int], str, list[str]]:
        async with SandboxPool(warm_per_spec=1, max_warm=1) as pool:
            await pool.release(await pool.acquire(SPEC))
            await pool.wait_warm()
            counts = [pool.warm_count(SPEC)]
            evicted = pool._warm[SPEC][0].id
            await pool.release(await pool.acquire(other))  # the cap is 1: SPEC's warm sandbox gives way
            await pool.wait_warm()
            counts += [pool.warm_count(SPEC), pool.warm_count(other), pool.warm_total]
            deadline = time.monotonic() + 30
            while evicted in containers_of_pid(os.getpid()) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            return counts, evicted, containers_of_pid(os.getpid())

    counts, evicted, left = run(scenario())
    assert counts == [1, 0, 1, 1]
    assert evicted not in left


_OWNER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, time
    from terminus_env.sandbox import Sandbox, SandboxSpec, BASE_IMAGE
    async def main():
        sandbox = await Sandbox.start(SandboxSpec(BASE_IMAGE))
        print(sandbox.id, flush=True)
        await asyncio.sleep(600)
    asyncio.run(main())
    """
)


def test_sigkilled_owner_leaves_nothing_after_the_reaper(client: docker.DockerClient) -> None:
    child = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        container_id = child.stdout.readline().strip()  # type: ignore[union-attr]
        assert client.api.inspect_container(container_id)["State"]["Running"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    reap(client=client)
    deadline = time.monotonic() + 15
    while containers_of_pid(child.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert containers_of_pid(child.pid) == []


def test_sigterm_removes_the_owners_containers(client: docker.DockerClient) -> None:
    child = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT], stdout=subprocess.PIPE, text=True, cwd=REPO)
    container_id = child.stdout.readline().strip()  # type: ignore[union-attr]
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(container_id)


def test_reaper_removes_containers_of_dead_owners_only(client: docker.DockerClient) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead_owner = Owner(int(dead.stdout), "1", Owner.current().host)
    made = []
    for owner in (dead_owner, Owner.current()):
        container = client.containers.run(
            SPEC.image, ["sleep", "120"], detach=True, auto_remove=True, network_mode="none",
            labels=owner.labels("reaper-test"),
        )  # fmt: skip
        made.append(container.id)
    try:
        # Another process's reaper (any sandbox start runs one) may take the dead owner's container first: what
        # holds is that it is gone once a reap has run, and the living owner's stays.
        reap(client=client)
        with pytest.raises(docker.errors.NotFound):
            client.api.inspect_container(made[0])
        assert client.api.inspect_container(made[1])["State"]["Running"]
    finally:
        for container_id in made:
            try:
                client.api.remove_container(container_id, force=True)
            except docker.errors.NotFound:
                pass


def test_no_engine_is_docker_unavailable(run: Runner, tmp_path: Path) -> None:
    dead = docker.DockerClient(base_url=f"unix://{tmp_path}/no-engine.sock", version="1.41", timeout=5)
    with pytest.raises(DockerUnavailable, match="dockerd"):
        run(Sandbox.start(SPEC, client=dead))
    with pytest.raises(DockerUnavailable):
        reap(client=dead)


# --- images ------------------------------------------------------------------------------------


def test_ensure_image_builds_once_and_reports_failures(client: docker.DockerClient, tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "Dockerfile").write_text(f"FROM {SPEC.image}\nRUN echo built-{time.time_ns()} > /built\n")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Dockerfile").write_text(f"FROM {SPEC.image}\nRUN echo about-to-fail && exit 3\n")
    tag = ensure_image(good, "Sandbox Test Good!")
    try:
        assert tag.startswith("terminus-env/task-sandbox-test-good:")
        image_id = client.images.get(tag).id
        started = time.monotonic()
        assert ensure_image(good, "Sandbox Test Good!") == tag
        assert time.monotonic() - started < 5 and client.images.get(tag).id == image_id
        with pytest.raises(ImageBuildError, match="sandbox-test-bad") as failure:
            ensure_image(bad, "sandbox-test-bad")
        assert "about-to-fail" in str(failure.value)
    finally:
        client.images.remove(tag, force=True)


def test_build_context_leaves_out_bytecode_caches_and_dockerignored_files(
    client: docker.DockerClient, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {SPEC.image}\nCOPY . /ctx\n")
    (tmp_path / ".dockerignore").write_text("# local notes\n\nnotes.txt\n")
    (tmp_path / "notes.txt").write_text("not for the image\n")
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tool.py").write_text(f"print({time.time_ns()})\n")
    for cache in (tmp_path / "__pycache__", tmp_path / "app" / "__pycache__"):
        cache.mkdir()
        (cache / "tool.cpython-311.pyc").write_bytes(b"\x00" * 16)
    tag = ensure_image(tmp_path, "sandbox-test-context")
    try:
        listing = client.containers.run(tag, "find /ctx -mindepth 1", remove=True).decode().split()
        assert sorted(listing) == ["/ctx/.dockerignore", "/ctx/Dockerfile", "/ctx/app", "/ctx/app/tool.py"]
    finally:
        client.images.remove(tag, force=True)


@pytest.mark.parametrize("ending", ["return", "sigint"])
def test_containers_are_removed_when_the_owner_exits(client: docker.DockerClient, ending: str) -> None:
    script = _OWNER_SCRIPT.replace("asyncio.sleep(600)", "asyncio.sleep(0 if sys.argv[1] == 'return' else 600)")
    child = subprocess.Popen([sys.executable, "-c", script, ending], stdout=subprocess.PIPE, text=True, cwd=REPO)
    container_id = child.stdout.readline().strip()  # type: ignore[union-attr]
    if ending == "sigint":
        child.send_signal(signal.SIGINT)
    child.wait(timeout=30)
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(container_id)


def test_lifetime_backstop_ends_the_container(run: Runner, client: docker.DockerClient) -> None:
    sandbox = run(Sandbox.start(SandboxSpec(SPEC.image, lifetime_s=2)))
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                client.api.inspect_container(sandbox.id)
            except docker.errors.NotFound:
                break
            time.sleep(0.25)
        else:
            pytest.fail("the container outlived its lifetime_s by 18 s")
    finally:
        run(sandbox.close())


@pytest.mark.parametrize(
    ("removed", "error"),
    [("/usr/bin/python3*", "needs python3"), ("/usr/bin/tmux", "the image needs tmux and bash")],
    ids=["python3", "tmux"],
)
def test_an_image_without_python3_or_tmux_is_a_clear_error(
    run: Runner, client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removed: str,
    error: str,
) -> None:
    """The start fails before (python3) or after (tmux) the channel is open: either way it says what the image
    lacks, and leaves neither the container nor the channel's folder behind. Only this start's folder is looked at:
    other sandboxes on the host come and go meanwhile."""
    (tmp_path / "Dockerfile").write_text(f"FROM {SPEC.image}\nRUN rm -f {removed}\n")
    tag = ensure_image(tmp_path, f"sandbox-test-no-{removed.split('/')[-1].rstrip('*')}")
    made: list[ChannelFolder] = []
    make = ChannelFolder.make

    def recorded(root: Path | None = None) -> ChannelFolder:
        made.append(make(root))
        return made[-1]

    monkeypatch.setattr(ChannelFolder, "make", recorded)
    containers = set(containers_of_pid(os.getpid()))
    try:
        with pytest.raises(SandboxError, match=error):
            run(Sandbox.start(SandboxSpec(tag)))
        direct = channel_route(client, client.info()) is Route.DIRECT
        assert len(made) == (1 if direct else 0) and not any(folder.path.exists() for folder in made)
        assert set(containers_of_pid(os.getpid())) <= containers
    finally:
        client.images.remove(tag, force=True)


def test_a_container_removed_while_the_daemon_starts_is_the_same_clear_error() -> None:
    """The race the test above can hit: the main process died and Docker's auto-removal is under way, so the exec
    fails with a 500 ("is not running: Removal In Progress"), not a 404 or 409."""
    from terminus_env.sandbox.channel import _start_relay

    class Api:
        def exec_create(self, *args: object, **kwargs: object) -> dict:
            return {"Id": "e1"}

        def exec_start(self, *args: object, **kwargs: object) -> None:
            response = requests.Response()
            response.status_code = 500
            explanation = "Container c1 is not running: Removal In Progress"
            raise docker.errors.APIError("500 Server Error", response, explanation)

        def inspect_container(self, container_id: str) -> dict:
            raise docker.errors.NotFound("No such container: c1")

    class Client:
        api = Api()

    with pytest.raises(SandboxError, match="stopped as soon as it started: its main process needs python3"):
        _start_relay(Client(), "c1" * 32, [])  # type: ignore[arg-type]


def test_pool_skips_a_warm_sandbox_that_died(run: Runner, client: docker.DockerClient) -> None:
    async def scenario() -> tuple[str, str, str]:
        async with SandboxPool(warm_per_spec=1) as pool:
            await pool.release(await pool.acquire(SPEC))
            await pool.wait_warm()
            warm = pool._warm[SPEC][0]
            client.api.kill(warm.id)
            while warm.alive:
                await asyncio.sleep(0.05)
            fresh = await pool.acquire(SPEC)
            await fresh.terminal.send("echo fresh\n", 5)
            return warm.id, fresh.id, (await fresh.terminal.capture_new()).text

    dead_id, fresh_id, text = run(scenario())
    assert fresh_id != dead_id and "\nfresh\n" in text


def test_pool_hands_out_no_warm_sandbox_too_old_for_an_episode(run: Runner) -> None:
    """A container ends at its lifetime, counted from its start however long it sat warm. A warm sandbox with less
    life left than an episode needs would die in the middle of one (an episode lost as the infrastructure's
    failure): the pool removes it and starts another, which lives through the episode."""
    spec = SandboxSpec(SPEC.image, lifetime_s=24, life_needed_s=8)

    async def scenario() -> tuple[bool, bool, str]:
        async with SandboxPool(warm_per_spec=1) as pool:
            await pool.release(await pool.acquire(spec))
            await pool.wait_warm()
            old = pool._warm[spec][0]
            warm_since = time.monotonic()  # the warm one started before this moment
            await asyncio.sleep(warm_since + 16.5 - time.monotonic())  # it ages: under 8 s of its 24 s are left
            episode = await pool.acquire(spec)
            result = await episode.exec("sleep 8; echo lived", 30)  # an episode as long as the spec says
            return episode is old, old.closed, result.output

    handed_out_old, old_removed, output = run(scenario())
    assert not handed_out_old and old_removed and output == "lived\n"
