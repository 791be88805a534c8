"""The control channel's rules that need no Docker: which route a host takes, who the daemon takes as the host,
the channel folders the reaper removes, and how the host reads a DIRECT channel's lines."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from terminus_env import config
from terminus_env.config import ConfigError
from terminus_env.sandbox import channel as channel_module
from terminus_env.sandbox.channel import (
    LOCAL_ENGINE_URL,
    Channel,
    ChannelFolder,
    Route,
    channel_route,
    direct_unreachable,
    reap_folders,
)
from terminus_env.sandbox.docker_client import connect
from terminus_env.sandbox.errors import (
    AgentCaused,
    BrokenByAgent,
    DaemonFailed,
    DaemonUnanswered,
    ResourcesExhausted,
    SandboxError,
)
from terminus_env.sandbox.images import BASE_IMAGE
from terminus_env.sandbox.inside.channel import take_channel
from terminus_env.sandbox.inside.names import DIRECT
from terminus_env.sandbox.owner import Owner, process_start
from terminus_env.sandbox.sandbox import _runs_unheld

LOCAL = {"Name": "box", "DockerRootDir": "/var/lib/docker", "SecurityOptions": ["name=seccomp,profile=default"]}


def unreachable(**changes: Any) -> str | None:
    arguments: dict[str, Any] = {"base_url": LOCAL_ENGINE_URL, "info": LOCAL, "hostname": "box", "euid": 0}
    arguments.update(changes)
    return direct_unreachable(is_dir=lambda path: path in ("/var/lib/docker", "/run/user/1000"), **arguments)


def test_a_local_engine_with_a_root_owner_is_reached_directly() -> None:
    assert unreachable() is None
    assert unreachable(euid=1000, info={**LOCAL, "SecurityOptions": ["name=rootless"]}) is None


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"base_url": "http://10.0.0.2:2375"}, "not on a local unix socket"),
        ({"base_url": "http+docker://ssh"}, "not on a local unix socket"),
        ({"hostname": "laptop", "info": {**LOCAL, "Name": "docker-desktop"}}, "another machine or in a VM"),
        ({"info": {}}, "another machine or in a VM"),  # `docker info` failed: say nothing, take the relay
        ({"info": {**LOCAL, "SecurityOptions": ["name=userns"]}}, "userns-remap"),
        ({"euid": 1000}, "not root and the engine is not rootless"),
        ({"euid": 1001, "info": {**LOCAL, "SecurityOptions": ["name=rootless"]}}, "no runtime folder"),
        ({"info": {**LOCAL, "DockerRootDir": "/mnt/other"}}, "data root is not on this file system"),
    ],
    ids=["tcp", "ssh", "vm", "no-info", "userns", "user", "no-runtime-folder", "other-fs"],
)
def test_an_engine_that_cannot_see_our_folders_takes_the_relay(changes: dict[str, Any], why: str) -> None:
    reason = unreachable(**changes)
    assert reason is not None and why in reason


class Api:
    base_url = "http://10.0.0.2:2375"


class Client:
    api = Api()


def test_the_route_setting_chooses_and_a_wrong_one_is_a_clear_error() -> None:
    environ = {config.SANDBOX_CHANNEL: "relay"}
    assert channel_route(Client(), LOCAL, environ) is Route.RELAY  # type: ignore[arg-type]
    assert channel_route(Client(), LOCAL, {}) is Route.RELAY  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="=direct, but the engine is not on a local unix socket"):
        channel_route(Client(), LOCAL, {config.SANDBOX_CHANNEL: "direct"})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="names no route: set it to auto, direct or relay"):
        channel_route(Client(), LOCAL, {config.SANDBOX_CHANNEL: "pipe"})  # type: ignore[arg-type]


def test_the_reaper_removes_the_folders_of_owners_that_are_gone(tmp_path: Path) -> None:
    live = ChannelFolder.make(tmp_path)
    assert live.path.name.startswith(f"{os.getpid()}-{process_start(os.getpid())}-")
    assert oct(live.path.stat().st_mode & 0o777) == "0o700"
    dead = tmp_path / f"{os.getpid()}-1-abc"  # our pid, another start time: an earlier process with this pid
    stray = tmp_path / "not-ours"
    for path in (dead, stray):
        path.mkdir()
        (path / "channel").write_text("")
    assert reap_folders(tmp_path) == 2
    assert sorted(tmp_path.iterdir()) == [live.path]
    live.remove()
    assert list(tmp_path.iterdir()) == []


def test_the_daemon_takes_no_host_from_inside_the_container(tmp_path: Path) -> None:
    """The attack: a process of the container (anything the agent starts, a `docker exec`) listens where the daemon
    looks for the host, to receive its requests' answers or send it requests. Its pid is visible in the daemon's
    PID namespace (the host's is 0 there), so the daemon refuses it: the container then ends, fail closed."""
    path = str(tmp_path / "channel")
    impostor = socket.socket(socket.AF_UNIX)
    impostor.bind(path)
    impostor.listen(1)
    with pytest.raises(PermissionError, match=f"process {os.getpid()} .* not the host"):
        take_channel(path, DIRECT, 5)
    impostor.close()


def test_the_daemon_gives_up_on_a_host_that_never_listens(tmp_path: Path) -> None:
    with pytest.raises(socket.timeout, match="did not listen"):
        take_channel(str(tmp_path / "channel"), DIRECT, 0.05)


def test_a_channel_folder_listens_from_the_start_and_stops_once_connected(tmp_path: Path) -> None:
    folder = ChannelFolder.make(tmp_path)
    client = socket.socket(socket.AF_UNIX)
    client.connect(folder.socket_path)  # the host listens before the container exists
    folder.stop_listening()
    assert list(folder.path.iterdir()) == []
    client.close()
    folder.remove()
    assert not folder.path.exists()


class Writer:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        return None


def test_a_direct_channel_reads_replies_in_pieces_and_the_daemons_stderr_lines(tmp_path: Path) -> None:
    """A reply of megabytes arrives in many reads; a line of the daemon's stderr (no id) is kept apart, so a
    traceback there still tells our bugs from the agent's doing; anything else is dropped and counted. Closing
    the channel removes its folder."""
    folder = ChannelFolder.make(tmp_path)

    async def scenario() -> tuple[dict[str, Any], str, int]:
        reader = asyncio.StreamReader()
        channel = Channel(reader, Writer(), folder)  # type: ignore[arg-type]
        asking = asyncio.ensure_future(channel.request("read", 5))
        await asyncio.sleep(0)
        big = json.dumps({"id": 0, "ok": True, "data": "x" * 3_000_000}).encode()
        reader.feed_data(b'{"stderr": "Traceback (most recent call last):\\n"}\nnot json\n' + big[:1000])
        for start in range(1000, len(big), 70_000):
            await asyncio.sleep(0)
            reader.feed_data(big[start : start + 70_000])
        reader.feed_data(b"\n")
        reply = await asking
        await channel.close()
        return reply, channel.stderr, channel.dropped_lines

    reply, stderr, dropped = asyncio.run(scenario())
    assert reply["data"] == "x" * 3_000_000
    assert stderr == "Traceback (most recent call last):\n" and dropped == 1
    assert not folder.path.exists()


@pytest.mark.parametrize("reply, raised", [
    ({"error": "KeyError: 'x'"}, DaemonFailed),  # nothing explains it: the agent's, fail closed
    ({"error": "the verifier's shell is gone", "blame": "agent"}, BrokenByAgent),
    ({"error": "cannot start a process: fork", "spawn_errno": 11}, ResourcesExhausted),
])  # fmt: skip
def test_a_failed_request_is_the_agents_unless_the_host_can_show_otherwise(
    tmp_path: Path, reply: dict[str, Any], raised: type[SandboxError]
) -> None:
    """An agent that finds any input tripping a daemon request must not turn its 0 into a masked episode: a failure
    the daemon cannot explain counts as the agent's (the env ends such a turn ``shell_lost``, such a grading
    ``verifier_broken``). Only a broken channel, which nothing in the container can cause, is the host's."""
    folder = ChannelFolder.make(tmp_path)

    async def scenario() -> BaseException:
        reader = asyncio.StreamReader()
        channel = Channel(reader, Writer(), folder)  # type: ignore[arg-type]
        asking = asyncio.ensure_future(channel.request("verify", 5))
        await asyncio.sleep(0)
        reader.feed_data(json.dumps({"id": 0, "ok": False, **reply}).encode() + b"\n")
        try:
            await asking
        except SandboxError as exc:
            return exc
        finally:
            await channel.close()
        raise AssertionError("the failed request raised nothing")

    error = asyncio.run(scenario())
    assert type(error) is raised and isinstance(error, AgentCaused) and reply["error"] in str(error)


@pytest.mark.parametrize("running_unheld, raised", [
    (None, SandboxError),  # before the agent exists: nothing of its ran
    (lambda: True, DaemonUnanswered),  # the container ran unpaused: the agent's processes stalled the daemon
    (lambda: False, SandboxError),  # paused, stopped or the engine gone: the host's
])  # fmt: skip
def test_an_unanswered_request_is_the_agents_unless_the_container_was_held_from_outside(
    tmp_path: Path, running_unheld: Any, raised: type[SandboxError]
) -> None:
    """An agent that stops its own tmux server (``kill -STOP``) or takes the daemon's CPU leaves a request
    unanswered; that must not turn its 0 into a masked episode (the attack itself: ``test_attacks.py``'s
    ``tmux-stopped``)."""

    async def scenario() -> BaseException:
        channel = Channel(asyncio.StreamReader(), Writer(), ChannelFolder.make(tmp_path))  # type: ignore[arg-type]
        channel.unanswered_is_agents = running_unheld
        try:
            await channel.request("step", 0.01)
        except SandboxError as exc:
            return exc
        finally:
            await channel.close()
        raise AssertionError("the unanswered request raised nothing")

    error = asyncio.run(scenario())
    assert type(error) is raised and "did not answer 'step'" in str(error)


def test_a_paused_container_is_held_from_outside_and_a_running_one_is_not(docker_required: None) -> None:
    client = connect()
    container = client.containers.run(BASE_IMAGE, ["sleep", "300"], detach=True, labels=Owner.current().labels("t"))
    try:
        assert _runs_unheld(client, container.id)
        container.pause()
        assert not _runs_unheld(client, container.id)
        container.unpause()
        container.kill()
        container.wait()
        assert not _runs_unheld(client, container.id)
    finally:
        container.remove(force=True)
    assert not _runs_unheld(client, container.id)  # gone


def test_no_connection_is_lost_when_the_wait_for_it_times_out_as_it_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of starts whose daemons connect at random moments while the host's wait for them times out every
    0.1 ms: each connection lands in some wait's last moment now and then. Every one must be taken (a lost one is
    a start that fails only at its deadline)."""
    monkeypatch.setattr(channel_module, "ACCEPT_POLL_S", 1e-4)
    monkeypatch.setattr(channel_module, "_running", lambda client, container_id: True)
    rng = random.Random(7)

    async def start(delay_s: float) -> bool:
        folder = ChannelFolder.make(tmp_path)
        path = folder.socket_path

        def daemon() -> socket.socket:
            threading.Event().wait(delay_s)  # the daemon's moment, random within a few milliseconds
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
            return sock

        connecting = asyncio.get_running_loop().run_in_executor(None, daemon)
        try:
            _, writer = await channel_module._accept(None, "c" * 12, folder, 30.0)  # type: ignore[arg-type]
        except SandboxError:
            return False
        finally:
            (await connecting).close()
        writer.close()
        folder.remove()
        return True

    async def burst() -> list[bool]:
        taken: list[bool] = []
        for _ in range(20):
            taken += await asyncio.gather(*(start(rng.random() * 0.005) for _ in range(20)))
        return taken

    taken = asyncio.run(burst())
    assert taken.count(False) == 0, f"{taken.count(False)} of {len(taken)} connections were lost"


def frame(stream: int, payload: bytes) -> bytes:
    """One of Docker's multiplexed frames, as the relay's exec carries the daemon's stdout (1) and stderr (2)."""
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_a_relay_channel_reads_a_reply_cut_into_many_frames_in_linear_work() -> None:
    """A 12 MB reply in 300,000 frames of 40 bytes, then one large frame that ends it and holds 2,000 more replies.
    Joining the pieces as they come and cutting the whole buffer again at every frame copies terabytes here (the
    run never ends); joining them once, when the line ends, copies each byte a few times."""
    big = json.dumps({"id": 0, "ok": True, "data": "x" * 12_000_000}).encode()
    cut = len(big) - 10
    small = [json.dumps({"id": i, "ok": True, "n": i}).encode() for i in range(1, 2001)]

    async def scenario() -> tuple[list[dict[str, Any]], str]:
        reader = asyncio.StreamReader()
        channel = Channel(reader, Writer())  # type: ignore[arg-type]
        asking = [asyncio.ensure_future(channel.request("read", 600)) for _ in range(2001)]
        await asyncio.sleep(0)
        reader.feed_data(frame(2, b"a line on the daemon's stderr\n"))
        reader.feed_data(b"".join(frame(1, big[start : min(start + 40, cut)]) for start in range(0, cut, 40)))
        reader.feed_data(frame(1, big[cut:] + b"\n" + b"\n".join(small) + b"\n"))
        replies = await asyncio.gather(*asking)
        await channel.close()
        return replies, channel.stderr

    replies, stderr = asyncio.run(scenario())
    assert replies[0]["data"] == "x" * 12_000_000
    assert [reply["n"] for reply in replies[1:]] == list(range(1, 2001))
    assert stderr == "a line on the daemon's stderr\n"
