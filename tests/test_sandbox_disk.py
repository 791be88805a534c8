"""The disk watch: one thread per engine measures every sandbox's writable layer, by walking it or asking Docker.

The attacks themselves (filling the disk, one huge file, a nest too deep to measure) are played through the env in
test_attacks.py; here are the watch's parts: the rules (a layer that cannot be measured is over its limit), the walk
(it must count what Docker counts, at any depth, with few descriptors, and never follow the agent's links), and the
two ways of measuring, each through the watch's own thread, on real containers.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.errors import APIError
from sandbox_support import SPEC, Runner, run_fixture  # noqa: F401

from terminus_env.sandbox import AgentCaused, Sandbox, SandboxError, disk
from terminus_env.sandbox.disk import (
    HARD_LIMIT_HEADROOM_MB,
    DiskWatch,
    Layer,
    Unmeasured,
    Use,
    disk_watch,
    engine_use,
    over_limit,
)

MB = 1024 * 1024
THREAD = "terminus-env-disk-watch"


def until(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Wait for ``condition``, a state the watch shows; ``timeout_s`` only ends a test that hangs."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.05)


@pytest.mark.parametrize(("used_mb", "broken"), [(63.9, False), (64.0, False), (64.01, True), (65.0, True)])
def test_a_layer_breaks_its_limit_once_past_it(used_mb: float, broken: bool) -> None:
    """Past it, not at it; where the engine enforces a hard limit it lies HARD_LIMIT_HEADROOM_MB above, so a
    filled layer is past the limit there too."""
    assert over_limit(int(used_mb * MB), 64) is broken
    assert over_limit((64 + HARD_LIMIT_HEADROOM_MB) * MB, 64)


def test_a_layer_that_cannot_be_measured_is_past_its_limit() -> None:
    assert over_limit(Unmeasured("Docker reported its size as -1"), 64)
    assert over_limit(Unmeasured("no size"), 1_000_000)


@pytest.mark.parametrize(("entry", "use"), [
    ({"SizeRw": 5_000, "SizeRootFs": 9_000}, 5_000),
    ({"SizeRootFs": 9_000}, 0),  # Docker leaves a SizeRw of 0 out; SizeRootFs shows it measured the layer
    ({"SizeRw": -1, "SizeRootFs": 9_000}, None),  # Docker 20.10, when its own walk failed (a path past PATH_MAX)
    ({"SizeRw": -7}, None),
    ({"SizeRw": None, "SizeRootFs": 9_000}, None),
    ({}, None),  # an engine that measured nothing
    ({"SizeRootFs": 0}, None),
    ({"SizeRw": "5000"}, None),
    ({"SizeRw": True}, None),
])  # fmt: skip
def test_docker_answers_a_size_or_the_layer_is_unmeasured_never_0(entry: dict[str, Any], use: int | None) -> None:
    if use is None:
        assert isinstance(engine_use(entry), Unmeasured)
        assert over_limit(engine_use(entry), 10_000)
    else:
        assert engine_use(entry) == use


class Engine:
    """A Docker client whose listing answers what a test says (an engine that cannot measure a layer)."""

    def __init__(self, answer: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> None:
        self.api = self
        self.answer = answer
        self.calls: list[dict[str, Any]] = []

    def containers(self, *, all: bool, size: bool, filters: dict[str, Any]) -> list[dict[str, Any]]:
        assert all and size
        self.calls.append(filters)
        return self.answer(filters)


def docker_layer(container_id: str, limit_mb: int = 100) -> Layer:
    return Layer(container_id, "engine", limit_mb, False, None)  # no folder here: only Docker can measure it


@pytest.mark.parametrize("size_rw", [-1, None], ids=["minus-1", "none"])
def test_a_layer_docker_cannot_measure_is_reported_past_its_limit(size_rw: int | None) -> None:
    """Through the watch's own thread: Docker answered no size for a layer this process cannot walk."""
    entry = {"Id": "c1", "SizeRootFs": 200_000_000, "SizeRw": size_rw}
    watch = DiskWatch(Engine(lambda _: [entry]), interval_s=0.01)  # type: ignore[arg-type]
    reports: list[Use] = []
    reported = threading.Event()

    def on_over(used: Use) -> None:
        reports.append(used)
        reported.set()

    watch.add(docker_layer("c1"), on_over)
    until(reported.is_set, "the watch reporting a layer Docker could not measure")
    assert len(reports) == 1 and isinstance(reports[0], Unmeasured) and repr(size_rw) in reports[0].why
    assert watch.watched == 0


def test_a_refused_listing_is_asked_again_per_container_and_only_the_failing_layer_is_over() -> None:
    """A newer engine fails a listing on a size it cannot take: one layer's failure must not pass for another's."""

    def answer(filters: dict[str, Any]) -> list[dict[str, Any]]:
        if "label" in filters or filters["id"] == ["deep"]:
            raise APIError("500 Server Error", explanation="walking the layer: file name too long")
        return [{"Id": filters["id"][0], "SizeRw": 1_000, "SizeRootFs": 9_000}]

    engine = Engine(answer)
    used = DiskWatch(engine).measure_all([docker_layer("deep"), docker_layer("fine")])  # type: ignore[arg-type]
    assert used["fine"] == 1_000
    assert isinstance(used["deep"], Unmeasured) and "file name too long" in used["deep"].why
    assert len(engine.calls) == 3  # the listing of all, then one per container


def test_an_engine_that_does_not_answer_is_asked_again_next_round() -> None:
    """No answer at all is the infrastructure's (check_disk then fails the episode as such), not the layer's size."""

    def answer(filters: dict[str, Any]) -> list[dict[str, Any]]:
        raise docker.errors.DockerException("connection refused")

    watch = DiskWatch(Engine(answer))  # type: ignore[arg-type]
    assert watch.measure_all([docker_layer("c1")]) == {}
    with pytest.raises(docker.errors.DockerException):
        watch.measure(docker_layer("c1"))


def test_an_engine_that_cannot_measure_a_new_layer_fails_the_start_not_the_agent() -> None:
    """Before any agent runs: otherwise every episode there would end ``resource_limit``, the agent's 0."""
    silent = DiskWatch(Engine(lambda filters: [{"Id": filters["id"][0]}]))  # type: ignore[arg-type]
    with pytest.raises(SandboxError, match="Docker cannot measure a new sandbox's writable layer"):
        silent.check_engine(docker_layer("c1"))
    engine = Engine(lambda filters: [{"Id": filters["id"][0], "SizeRootFs": 9_000}])
    fine = DiskWatch(engine)  # type: ignore[arg-type]
    fine.check_engine(docker_layer("c1"))
    fine.check_engine(docker_layer("c2"))
    fine.check_engine(Layer("c3", "engine", 100, False, "/walked/here"))
    assert len(engine.calls) == 1  # once per engine, and never for a layer this process walks


def test_the_walk_counts_files_once_and_never_follows_links(tmp_path: Path) -> None:
    layer, outside = tmp_path / "layer", tmp_path / "outside"
    (layer / "a" / "b").mkdir(parents=True)
    outside.mkdir()
    (outside / "big").write_bytes(b"x" * 100_000)
    (layer / "one").write_bytes(b"x" * 1000)
    (layer / "a" / "b" / "two").write_bytes(b"x" * 2000)
    os.link(layer / "one", layer / "a" / "same-as-one")  # a hard link: the same bytes, counted once
    (layer / "to-outside").symlink_to(outside)  # a link to a folder: its size is the link's, never the folder's
    assert disk._walk(str(layer)) == 1000 + 2000 + len(str(outside))
    with pytest.raises(FileNotFoundError):
        disk._walk(str(tmp_path / "gone"))


def nest(top: Path, depth: int, name: str, side_every: int = 0) -> int:
    """``depth`` folders under ``top``, each in the last, made one level at a time (the path soon passes PATH_MAX),
    a 3000-byte file at the bottom and, every ``side_every`` levels, a side folder with a 10-byte file; the bytes."""
    written = 0
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            if side_every and level % side_every == 0:
                os.mkdir("side", dir_fd=fd)
                os.close(os.open("side/f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
                os.truncate(f"/proc/self/fd/{fd}/side/f", 10)
                written += 10
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        data = os.open("data", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        os.write(data, b"x" * 3000)
        os.close(data)
    finally:
        os.close(fd)
    return written + 3000


def test_the_walk_measures_a_nest_of_any_depth_holding_few_descriptors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """600 levels, a path of over 12,000 characters (Docker 20.10 answers -1 there), with side folders on the way
    down, so the walk comes back up through folders it had closed and goes down again."""
    (tmp_path / "top").write_bytes(b"x" * 100)
    expected = 100 + nest(tmp_path, 600, "nest-of-twenty-chars", side_every=50)
    open_before = len(os.listdir("/proc/self/fd"))
    most_open: list[int] = []
    read_folder = disk._read_folder

    def counting(folder: int, seen: set[int]) -> tuple[int, list[str]]:
        most_open.append(len(os.listdir("/proc/self/fd")) - open_before)
        return read_folder(folder, seen)

    monkeypatch.setattr(disk, "_read_folder", counting)
    assert disk._walk(str(tmp_path)) == expected
    assert max(most_open) == disk.MAX_OPEN_FOLDERS  # the open levels of the path it is on, however deep
    monkeypatch.setattr(disk, "MAX_OPEN_FOLDERS", 3)
    assert disk._walk(str(tmp_path)) == expected


def test_a_folder_moved_while_the_walk_is_below_it_is_not_measured_as_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Coming back up through ``..`` to a folder it had closed, the walk finds another one: it cannot tell what it
    missed, so the layer goes to Docker (and counts as over its limit if Docker cannot tell either)."""
    monkeypatch.setattr(disk, "MAX_OPEN_FOLDERS", 2)
    (tmp_path / "a" / "b" / "c" / "d" / "e").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    read_folder = disk._read_folder

    def moving(folder: int, seen: set[int]) -> tuple[int, list[str]]:
        if os.readlink(f"/proc/self/fd/{folder}").endswith("/e"):
            os.rename(tmp_path / "a" / "b" / "c", tmp_path / "elsewhere" / "c")
        return read_folder(folder, seen)

    monkeypatch.setattr(disk, "_read_folder", moving)
    assert disk._walk(str(tmp_path)) is None


@pytest.fixture(scope="module")
def sandboxes(run: Runner) -> Iterator[list[Sandbox]]:
    async def start() -> list[Sandbox]:
        return list(await asyncio.gather(*(Sandbox.start(SPEC) for _ in range(3))))

    async def close(started: list[Sandbox]) -> None:
        await asyncio.gather(*(sandbox.close() for sandbox in started))

    started = run(start())
    yield started
    run(close(started))


def test_one_thread_watches_every_sandbox_of_the_process(run: Runner, sandboxes: list[Sandbox]) -> None:
    client = sandboxes[0]._client  # noqa: SLF001 - the engine the sandboxes run on
    engine = client.info()["ID"]
    assert all(sandbox._layer.engine == engine for sandbox in sandboxes)  # noqa: SLF001 - by ID: one per engine
    watch = disk_watch(client, engine)
    assert all(disk_watch(sandbox._client, engine) is watch for sandbox in sandboxes)  # noqa: SLF001
    assert watch.watched >= len(sandboxes)
    assert [thread.name for thread in threading.enumerate()].count(THREAD) == 1
    assert all(sandbox._layer.upper_dir for sandbox in sandboxes), "a local engine, run as root: walked"  # noqa: SLF001


def test_the_walk_counts_what_docker_counts(run: Runner, sandboxes: list[Sandbox]) -> None:
    sandbox = sandboxes[0]
    script = (
        "head -c 3000000 /dev/urandom > /root/data && ln /root/data /root/again && mkdir -p /opt/x/y && "
        "head -c 12345 /dev/zero > /opt/x/y/z && ln -s /usr /root/usr && rm -rf /etc/apt"  # a deletion: a whiteout
    )
    assert run(sandbox.exec(script, 30)).exit_code == 0
    walked = disk._walk(sandbox._layer.upper_dir)  # noqa: SLF001
    asked = disk._engine_uses(sandbox._client, [sandbox.id])[sandbox.id]  # noqa: SLF001
    assert walked == asked
    assert walked >= 3_000_000 + 12_345


def test_a_nest_docker_cannot_measure_is_walked(run: Runner, sandboxes: list[Sandbox]) -> None:
    """300 levels in a real layer, a path past PATH_MAX: the walk counts it all; Docker counts it too, or says it
    cannot (20.10 answers -1), which counts as over the limit."""
    sandbox = sandboxes[0]
    upper = sandbox._layer.upper_dir  # noqa: SLF001
    before = disk._walk(upper)
    nest = "cd /root && for i in $(seq 300); do mkdir nest-of-twenty-chars && cd nest-of-twenty-chars; done"
    assert run(sandbox.exec(f"{nest} && head -c 4000000 /dev/zero > data", 60)).exit_code == 0
    try:
        walked = disk._walk(upper)
        assert before is not None and walked == before + 4_000_000
        asked = disk._engine_uses(sandbox._client, [sandbox.id])[sandbox.id]  # noqa: SLF001
        assert asked == walked or (isinstance(asked, Unmeasured) and over_limit(asked, 10_000))
    finally:
        run(sandbox.exec("rm -rf /root/nest-of-twenty-chars", 60))


@pytest.mark.parametrize("way", ["walk", "docker"])
def test_the_watch_reports_a_layer_past_its_limit_once(run: Runner, sandboxes: list[Sandbox], way: str) -> None:
    """Through the watch's own thread, on a real container: measured by walking its layer, or by asking Docker (an
    engine this process cannot read)."""
    sandbox = sandboxes[1 if way == "walk" else 2]
    upper = sandbox._layer.upper_dir if way == "walk" else None  # noqa: SLF001
    watch = DiskWatch(docker.from_env(), interval_s=0.2)
    reports: list[Use] = []
    reported = threading.Event()
    rounds: list[dict[str, Use]] = []  # what each of the watch's rounds measured
    measure_all = watch.measure_all

    def measured(layers: list[Layer]) -> dict[str, Use]:
        rounds.append(measure_all(layers))
        return rounds[-1]

    def on_over(used: Use) -> None:
        reports.append(used)
        reported.set()

    watch.measure_all = measured  # type: ignore[method-assign]
    watch.add(Layer(sandbox.id, sandbox._layer.engine, 5, False, upper), on_over)  # noqa: SLF001
    until(lambda: len(rounds) >= 2, "two rounds of the watch")  # the first one's verdict is in once the next starts
    assert sandbox.id in rounds[0] and not reported.is_set(), "an idle sandbox is measured, far below 5 MB"
    assert run(sandbox.exec("head -c 6000000 /dev/zero > /root/fill", 30)).exit_code == 0
    until(reported.is_set, f"the watch ({way}) seeing 6 MB over a 5 MB limit")
    until(lambda: watch._thread is None, "the watch's thread ending with nothing to watch")  # noqa: SLF001
    assert len(reports) == 1 and reports[0] > 5 * MB  # past the limit when seen (maybe mid-write, on a slow machine)
    assert watch.watched == 0  # reported once, then no longer watched: no round can report it again
    run(sandbox.exec("rm -f /root/fill", 30))


def test_check_disk_measures_now_and_stops_the_agent(run: Runner) -> None:
    """Before grading the env asks for a measurement now, not the last round's."""
    sandbox = run(Sandbox.start(replace(SPEC, storage_mb=8)))
    try:
        sandbox._disk.remove(sandbox.id)  # noqa: SLF001 - out of the watch's rounds: only check_disk measures it
        assert run(sandbox.check_disk()) is None
        # Past the limit in two files of 5 MB (each under the per-file cap), measured at once.
        run(sandbox.exec("head -c 5000000 /dev/zero > /root/a; head -c 5000000 /dev/zero > /root/b", 30))
        violation = run(sandbox.check_disk())
        assert violation is not None and violation.limit_mb == 8 and violation.used_mb > 8
        assert sandbox.violation is violation and "8 MB" in str(violation)
        with pytest.raises(AgentCaused):  # the agent's side was stopped before check_disk returned
            run(sandbox.terminal.send("echo still-here\n", 2))
    finally:
        run(sandbox.close())
