"""The in-container code's pieces that run on the host's Python too (terminus_env/sandbox/inside is stdlib only): the
seccomp program, tmux's quoting, the capped buffer, the daemon's stderr lines, process handling, the users a process
runs as, and the verifier's private folders. What needs the container's namespaces is tested over Docker
(test_sandbox_container.py, test_attacks.py)."""

from __future__ import annotations

import errno
import io
import json
import os
import pwd
import shutil
import signal
import struct
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from terminus_env.sandbox.inside import channel, processes, seccomp, tmux
from terminus_env.sandbox.inside.private_folders import AgentFault, NotRegular, PrivateFolder
from terminus_env.sandbox.inside.tests_start import StartOfTests

# --- seccomp -------------------------------------------------------------------------------------------------------


def run_bpf(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """A classic-BPF interpreter for the few instructions the seccomp filter uses; returns the action."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    code = [struct.unpack("HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    pc, acc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif op == 0x06:
            return k
        else:
            taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[op]
            pc += jt if taken else jf
        pc += 1


ALLOW, EPERM, ENOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_seccomp_filter_denies_what_docker_denies_without_cap_sys_admin(machine: str) -> None:
    program = seccomp.seccomp_program(machine)
    for abi in seccomp._NATIVE_ABIS[machine]:
        arch, column = seccomp.AUDIT_ARCH[abi], seccomp._ABI_COLUMN[abi]
        for name, numbers in seccomp._SYSCALLS.items():
            nr = numbers[column]
            if nr is None or name == "clone":
                continue
            assert run_bpf(program, nr, arch) == (ENOSYS if name in ("clone3", "io_setup") else EPERM), (abi, name)
        clone = seccomp._SYSCALLS["clone"][column]
        assert run_bpf(program, clone, arch, arg0=0x01200011) == ALLOW  # what fork() passes
        assert run_bpf(program, clone, arch, arg0=0x10000000 | 0x11) == EPERM  # CLONE_NEWUSER
        assert run_bpf(program, 0 if abi == "x86_64" else 63, arch) == ALLOW  # read
    assert run_bpf(program, 0, 0x40000028) == ENOSYS  # an ABI the machine does not run natively
    if machine == "x86_64":
        assert run_bpf(program, 0x40000000 | 1, seccomp.AUDIT_ARCH["x86_64"]) == ENOSYS  # x32


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_verifiers_filter_refuses_taking_hold_of_another_process(machine: str) -> None:
    """ptrace may start a tracee of one's own (TRACEME) and work on it, never attach to a running process."""
    base, untraceable = seccomp.seccomp_program(machine), seccomp.seccomp_program(machine, untraceable=True)
    for abi in seccomp._NATIVE_ABIS[machine]:
        arch, column = seccomp.AUDIT_ARCH[abi], seccomp._ABI_COLUMN[abi]
        ptrace = seccomp._TRACING_SYSCALLS["ptrace"][column]
        for request in (seccomp.PTRACE_ATTACH, seccomp.PTRACE_SEIZE):
            assert run_bpf(untraceable, ptrace, arch, arg0=request) == EPERM, (abi, request)
            assert run_bpf(base, ptrace, arch, arg0=request) == ALLOW, (abi, request)
        for request in (0, 2, 5, 7, 17):  # TRACEME, PEEKDATA, POKEDATA, CONT, DETACH
            assert run_bpf(untraceable, ptrace, arch, arg0=request) == ALLOW, (abi, request)
        for name in ("process_vm_writev", "pidfd_getfd"):
            assert run_bpf(untraceable, seccomp._TRACING_SYSCALLS[name][column], arch) == EPERM, (abi, name)
        clone = seccomp._SYSCALLS["clone"][column]
        assert run_bpf(untraceable, clone, arch, arg0=0x10000000 | 0x11) == EPERM  # the base rules still hold


def test_the_seccomp_filter_refuses_an_unknown_machine() -> None:
    with pytest.raises(OSError, match="unsupported machine"):
        seccomp.seccomp_program("riscv64")


def test_the_agents_side_keeps_the_containers_capabilities_but_the_daemons() -> None:
    kept = seccomp.agent_capabilities()
    daemon_only = {seccomp.CAPABILITIES.index(name) for name in seccomp.DAEMON_ONLY_CAPS}
    assert kept == seccomp.own_capabilities() - daemon_only and not kept & daemon_only


def opened_in_order(start: StartOfTests, *files: tuple[str, bool]) -> None:
    """Tell ``start`` each (path, the image's own and unchanged) as opened, in order, by pytest from /app."""
    for order, (path, image_unchanged) in enumerate(files, 1):
        start.see(order, path, in_tests=False, written_by_verifier=False, image_unchanged=image_unchanged)


def test_the_images_own_conftest_begins_the_projects_test_code() -> None:
    start = StartOfTests([], expects_tests=True)
    opened_in_order(start, ("/usr/lib/python3/dist-packages/_pytest/main.py", True), ("/app/conftest.py", False),
                    ("/app/tests/conftest.py", True), ("/app/calc/__init__.py", False),
                    ("/app/tests/unit/conftest.py", False), ("/app/tests/test_calc.py", True))  # fmt: skip
    assert (start.project_at, start.tests_at, start.boundary()) == (3, 6, 6)
    assert start.early("/app/conftest.py", 2)  # the agent's, opened before: the runner's start
    assert not start.early("/app/calc/__init__.py", 4)  # what the image's conftest imports: the tests' subject
    assert start.early("/app/tests/unit/conftest.py", 5)  # a conftest before the first test file: configuration


def test_a_conftest_the_agent_made_or_changed_or_linked_begins_nothing() -> None:
    start = StartOfTests([{"target": "/usr/share/doc/conftest.py"}], expects_tests=True)
    opened_in_order(start, ("/usr/share/doc/conftest.py", True), ("/app/tests/conftest.py", False),
                    ("/app/calc/__init__.py", False))  # fmt: skip
    assert start.project_at is None and start.tests_at is None
    assert start.early("/app/calc/__init__.py", 3)  # no test file: everything was the runner's start (fail closed)


# --- tmux ----------------------------------------------------------------------------------------------------------


def test_tmux_argv_fallback_escapes_a_trailing_semicolon() -> None:
    seen = []

    class Recording(tmux.Tmux):
        def spawn_tmux(self, argv, user):  # noqa: ANN001, ANN202 - the daemon's own untyped style
            seen.append(argv)
            return True, ""

    commands = [["send-keys", "-l", "--", "a;"], ["send-keys", "-l", "--", "{} \\;"]]
    Recording(spawner=None).run_process({"tmux": ["tmux"]}, commands)
    assert seen == [["tmux", "send-keys", "-l", "--", "a\\;", ";", "send-keys", "-l", "--", "{} \\\\;"]]


def test_control_mode_quoting() -> None:
    assert tmux.control_quote('a "b" $HOME \\ ;\n\t\x1b') == '"a \\"b\\" \\$HOME \\\\ ;\\n\\011\\033"'


def tmux_unquote(quoted: str) -> str:
    """What tmux's command parser reads from a double-quoted argument (the escapes control_quote writes)."""
    assert quoted[0] == quoted[-1] == '"'
    out, body, index = [], quoted[1:-1], 0
    while index < len(body):
        ch = body[index]
        if ch == '"' or ch == "$":
            raise AssertionError(f"unescaped {ch!r} in {quoted!r}")
        if ch != "\\":
            out.append(ch)
            index += 1
            continue
        following = body[index + 1]
        if following.isdigit():
            out.append(chr(int(body[index + 1 : index + 4], 8)))
            index += 4
        else:
            out.append("\n" if following == "n" else following)
            index += 2
    return "".join(out)


@given(st.text(st.characters(blacklist_categories=("Cs",))))
def test_control_mode_quoting_reads_back_as_the_argument_on_one_line(text: str) -> None:
    quoted = tmux.control_quote(text)
    assert "\n" not in quoted and not any(ord(ch) < 32 or ord(ch) == 127 for ch in quoted)
    assert tmux_unquote(quoted) == text


# --- the capped buffer ---------------------------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=300), max_size=20), st.integers(min_value=0, max_value=600))
def test_the_capped_buffer_keeps_both_ends_and_counts_the_middle(chunks: list[bytes], limit: int) -> None:
    buffer = processes.CappedBuffer(limit)
    for chunk in chunks:
        buffer.add(chunk)
    data = b"".join(chunks)
    half = max(limit // 2, 1)
    assert bytes(buffer.head) == data[:half]
    assert len(buffer.tail) <= half and bytes(buffer.tail) == data[len(buffer.head) + buffer.omitted :]
    assert len(buffer.head) + buffer.omitted + len(buffer.tail) == len(data)
    assert buffer.omitted == max(len(data) - 2 * half, 0)


# --- the daemon's stderr on a DIRECT channel -----------------------------------------------------------------------


def test_the_daemons_stderr_goes_on_the_channel_as_lines() -> None:
    """What the daemon writes to stderr on a DIRECT channel (a traceback of ours) reaches the host as JSON lines
    between its replies, and a line is never split by a reply sent from another thread."""
    read_end, write_end = os.pipe()
    saved = os.dup(1)
    os.dup2(write_end, 1)
    try:
        lines = channel.ErrorLines()
        lines.write("Traceback (most recent call last):\n  File ")
        channel.send({"id": 3, "ok": True})
        lines.write('"x", line 1\nValueError: no\n')
        lines.write("tail")
        lines.flush()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        sent = [json.loads(line) for line in pipe.read().splitlines()]
    assert sent == [
        {"stderr": "Traceback (most recent call last):\n"},
        {"id": 3, "ok": True},
        {"stderr": '  File "x", line 1\n'},
        {"stderr": "ValueError: no\n"},
        {"stderr": "tail"},
    ]


# --- processes -----------------------------------------------------------------------------------------------------


def spawn(script: str, setsid: bool = False) -> int:
    return os.posix_spawnp("sh", ["sh", "-c", script], dict(os.environ), setsid=setsid)


def test_a_childs_exit_code_or_128_plus_its_signal() -> None:
    assert processes.Child(spawn("exit 3")).wait(10) == 3
    sleeper = processes.Child(spawn("exec sleep 30"))
    assert sleeper.wait(0.05) is None and sleeper.poll() is None
    sleeper.kill()
    assert sleeper.code == 128 + signal.SIGKILL


def session_members(session: int) -> list[int]:
    """The live (not zombie) processes of a session, from /proc."""
    return [pid for pid in processes._pids() if processes._session(pid) == session and not processes._zombie(pid)]


def test_kill_tree_stops_the_members_of_its_session_that_left_their_parent() -> None:
    """What a fork bomb leaves: processes whose parent is gone (here, `sleep`s orphaned by their subshells) are no
    longer below the root, but still in its session, and stop with it."""
    root = spawn("for i in 1 2 3; do (sleep 300 &); done; exec sleep 300", setsid=True)
    try:
        deadline = time.monotonic() + 10
        while (len(session_members(root)) < 4 or processes.descendants(root)) and time.monotonic() < deadline:
            time.sleep(0.01)  # the subshells end a moment after their `sleep`s start (longer on a loaded machine)
        assert len(session_members(root)) == 4 and len(processes.descendants(root)) == 0
        processes.kill_tree(root)
        assert session_members(root) == []
        assert processes._exit_code(os.waitpid(root, 0)[1]) == 128 + signal.SIGKILL
    finally:
        for pid in session_members(root):
            processes._signal(pid, signal.SIGKILL)


def unused_uid() -> int:
    for uid in range(54321, 64000):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    raise AssertionError("every uid from 54321 up has a user")


def test_the_users_a_process_runs_as() -> None:
    """Root needs no lookup (the agent may have rewritten /etc/passwd); a uid without a user runs as itself; an
    unknown name is refused."""
    for root in ("root", "0", "0:0", "root:root"):
        assert processes.credentials(root) == (0, 0, [0], "/root", "root")
    uid = unused_uid()
    assert processes.credentials(str(uid)) == (uid, uid, [uid], "/", str(uid))
    assert processes.credentials(f"{uid}:7") == (uid, 7, [7], "/", str(uid))
    entry = pwd.getpwnam("nobody")
    assert processes.credentials("nobody:0") == (
        entry.pw_uid, 0, os.getgrouplist("nobody", 0), entry.pw_dir, "nobody"
    )  # fmt: skip
    with pytest.raises(ValueError, match="no user 'no-such-user' in the container"):
        processes.credentials("no-such-user")


# --- the verifier's private folders ----------------------------------------------------------------------------------


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs of its own, as the host's private folders are (the root folder's device is refused)."""
    base = Path("/dev/shm")
    if not base.is_dir() or base.stat().st_dev == Path("/").stat().st_dev:
        pytest.skip("needs /dev/shm on a tmpfs of its own")
    path = Path(tempfile.mkdtemp(dir=base, prefix="terminus-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_private_folder_must_be_a_mount_of_its_own(tmp_path: Path) -> None:
    if tmp_path.stat().st_dev != Path("/").stat().st_dev:
        pytest.skip("the test's folder is not on the root folder's file system")
    with pytest.raises(OSError, match="is not the host's private mount"):
        PrivateFolder(str(tmp_path))


def test_a_private_folder_reads_plain_files_only(private: Path, tmp_path: Path) -> None:
    (private / "reward.txt").write_bytes(b"1\n")
    (private / "deep").mkdir()
    (private / "deep" / "big.bin").write_bytes(b"x" * 5000)
    os.mkfifo(private / "fifo")  # opened without waiting for a writer
    (private / "link").symlink_to(private / "reward.txt")
    (private / "through").symlink_to(private / "deep")
    folder = PrivateFolder(str(private))
    assert folder.read("reward.txt", 100) == b"1\n"
    assert folder.read("deep/big.bin", 1000) == b"x" * 1000
    assert folder.read("missing.txt", 100) is None
    for refused in ("fifo", "link", "through/big.bin", "deep"):
        with pytest.raises(NotRegular):
            folder.read(refused, 100)


def test_a_private_folder_put_in_its_place_is_tampering(private: Path) -> None:
    (private / "tests").mkdir()
    folder = PrivateFolder(str(private / "tests"))
    folder.check()
    (private / "tests").rename(private / "moved")
    (private / "tests").symlink_to(private / "moved")  # the same folder, reached another way
    with pytest.raises(AgentFault, match="tampered with"):
        folder.check()
    (private / "tests").unlink()
    (private / "tests").mkdir()
    with pytest.raises(AgentFault, match="no longer the verifier's private folder"):
        folder.check()


def test_emptying_a_private_folder_never_follows_a_link(private: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    (private / "a" / "b").mkdir(parents=True)
    (private / "a" / "b" / "c.txt").write_text("c")
    (private / "a" / "out").symlink_to(outside)
    (private / "top.txt").write_text("t")
    PrivateFolder(str(private)).empty()
    assert list(private.iterdir()) == [] and (outside / "keep.txt").read_text() == "mine"


def tar_of(members: list[tarfile.TarInfo]) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for member in members:
            archive.addfile(member, io.BytesIO(b"x" * member.size) if member.isfile() else None)
    return data.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 1, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size if kind == tarfile.REGTYPE else 0, target
    return info


@pytest.mark.parametrize(
    "bad",
    [member("../escape.py"), member("/abs.py"), member("a/../../x.py"), member("link", tarfile.SYMTYPE, target="/"),
     member("hard", tarfile.LNKTYPE, target="test.sh"), member("dev", tarfile.CHRTYPE)],
)  # fmt: skip
def test_the_tests_archive_holds_plain_files_and_folders_only(private: Path, bad: tarfile.TarInfo) -> None:
    folder = PrivateFolder(str(private))
    with pytest.raises(ValueError, match="plain files and folders only"):
        folder.unpack(tar_of([member("test.sh"), bad]))
    assert list(private.iterdir()) == []  # refused before anything was written
    folder.unpack(tar_of([member("sub", tarfile.DIRTYPE), member("sub/test_a.py", size=3), member("test.sh")]))
    assert (private / "sub" / "test_a.py").read_bytes() == b"xxx" and (private / "test.sh").read_bytes() == b"x"


# --- the verifier's caches -----------------------------------------------------------------------------------------


def test_the_verifiers_uv_cache_starts_from_the_images_without_what_the_agent_changed(tmp_path: Path) -> None:
    """An offline image fills uv's cache at build time; the verifier's fresh cache links in every part of it the
    agent's side did not change, and leaves out what it did: a changed file, a folder it added, anything below."""
    from terminus_env.sandbox.inside.verify import _seed

    image = tmp_path / "cache"
    (image / "archive-v0" / "pytest-aaaa" / "pytest").mkdir(parents=True)
    (image / "archive-v0" / "pytest-aaaa" / "pytest" / "__init__.py").write_text("# the image's\n")
    (image / "archive-v0" / "pluggy-bbbb").mkdir()
    (image / "archive-v0" / "pluggy-bbbb" / "hooks.py").write_text("# the agent changed this one\n")
    (image / "archive-v0" / "agents-cccc").mkdir()  # the agent's own entry
    (image / "wheels-v5").mkdir()
    (image / "wheels-v5" / "pytest.http").write_text("index")
    (image / ".lock").write_text("")
    changed = {str(image), str(image / "archive-v0"), str(image / "archive-v0" / "pluggy-bbbb"),
               str(image / "archive-v0" / "pluggy-bbbb" / "hooks.py"), str(image / "archive-v0" / "agents-cccc")}
    fresh = tmp_path / "fresh"
    assert _seed(str(image), str(fresh), frozenset(changed), 100) == 2
    assert (fresh / "wheels-v5").is_symlink() and (fresh / "archive-v0" / "pytest-aaaa").is_symlink()
    assert (fresh / "archive-v0" / "pytest-aaaa" / "pytest" / "__init__.py").read_text() == "# the image's\n"
    assert (fresh / "archive-v0" / "pluggy-bbbb").is_dir() and not (fresh / "archive-v0" / "pluggy-bbbb").is_symlink()
    assert list((fresh / "archive-v0" / "pluggy-bbbb").iterdir()) == []  # the changed file is left out
    assert not (fresh / "archive-v0" / "agents-cccc").is_symlink() and not (fresh / ".lock").exists()
    # a cache that is a link (the agent's, or anything but the image's folder) is not reused at all
    (tmp_path / "elsewhere").symlink_to(image)
    assert _seed(str(tmp_path / "elsewhere"), str(tmp_path / "fresh2"), frozenset(), 100) == 0
