"""The tmux terminal: the early-ending wait, keys versus text, chunking, capping, clear, bad input, exit."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import docker
import pytest
from sandbox_support import SPEC, Runner, run_fixture, sandbox_fixture, sandbox_on  # noqa: F401

from terminus_env.sandbox import (
    AgentCaused,
    Sandbox,
    SandboxError,
    SandboxLost,
    SandboxSpec,
    TerminalGone,
    ensure_image,
)

pytestmark = pytest.mark.docker


def step(run: Runner, sandbox: Sandbox, keys: str, duration: float) -> tuple[float, str]:
    waited = run(sandbox.terminal.send(keys, duration))
    return waited, run(sandbox.terminal.capture_new()).text


def test_short_command_returns_long_before_its_duration(run: Runner, sandbox: Sandbox) -> None:
    waited, text = step(run, sandbox, "echo hi\n", 10)
    assert waited < 2.0
    assert "\nhi\n" in text


def test_wait_ends_when_the_command_ends(run: Runner, sandbox: Sandbox) -> None:
    waited, text = step(run, sandbox, "sleep 3; echo slept\n", 10)
    assert 2.9 <= waited < 8
    assert "\nslept\n" in text


def test_long_command_keeps_running_after_the_duration(run: Runner, sandbox: Sandbox) -> None:
    waited, _ = step(run, sandbox, "sleep 30\n", 1)
    assert 0.95 <= waited < 5
    still = run(sandbox.exec("pgrep -f 'slee[p] 30'", 5))
    assert still.exit_code == 0, "sleep 30 should still be running in the terminal"
    waited, text = step(run, sandbox, "C-c", 5)
    assert waited < 3 and "^C" in text
    assert run(sandbox.exec("pgrep -f 'slee[p] 30'", 5)).exit_code == 1


def test_nested_script_and_command_substitution_count_as_running(run: Runner, sandbox: Sandbox) -> None:
    run(sandbox.put_file(b"sleep 1.5\necho nested-done\n", "/tmp/nested.sh"))
    waited, text = step(run, sandbox, "bash /tmp/nested.sh\n", 10)
    assert 1.4 <= waited < 6 and "nested-done" in text
    waited, text = step(run, sandbox, "x=$(sleep 1.5; echo sub); echo got-$x\n", 10)
    assert 1.4 <= waited < 6 and "got-sub" in text


def test_a_repl_waiting_for_input_is_a_foreground_job(run: Runner, sandbox: Sandbox) -> None:
    waited, text = step(run, sandbox, "python3 -q\n", 1.5)
    assert waited >= 1.45
    waited, text = step(run, sandbox, "print(6 * 7)\n", 1.0)
    assert "42" in text
    waited, _ = step(run, sandbox, "exit()\n", 5)
    assert waited < 3


def test_key_names_are_keys_and_other_text_is_literal(run: Runner, sandbox: Sandbox) -> None:
    step(run, sandbox, "-n", 0.5)  # would be an option to send-keys if not passed literally
    _, text = step(run, sandbox, "Enter", 5)
    assert "-n: command not found" in text
    _, text = step(run, sandbox, "echo a;echo b;\n", 5)
    assert "\na\nb\n" in text
    _, text = step(run, sandbox, "echo 'semi;'\n", 5)
    assert "\nsemi;\n" in text
    _, text = step(run, sandbox, "echo Enter C-c\n", 5)
    assert "\nEnter C-c\n" in text
    step(run, sandbox, "echo partial", 0.2)
    _, text = step(run, sandbox, "C-u", 0.5)  # readline: erase the line typed so far
    _, text = step(run, sandbox, "echo cleared-line\n", 5)
    assert "partial" not in text.split("\n")[0] and "cleared-line" in text


def test_text_with_quotes_dollars_backslashes_and_unicode_arrives_verbatim(run: Runner, sandbox: Sandbox) -> None:
    text = "".join(chr(c) for c in range(32, 127)) + "\tä€😀 \\; a;\n$HOME \"$(x)\" '{}' %s #{pane_pid} ~ -- ;\n"
    run(sandbox.terminal.send("cat > /tmp/verbatim.txt\n", 2))
    run(sandbox.terminal.send(text, 2))
    run(sandbox.terminal.send("C-d", 5))
    assert run(sandbox.read_file("/tmp/verbatim.txt")) == text.encode()
    run(sandbox.terminal.capture_new())


def test_input_over_16kb_arrives_whole(run: Runner, sandbox: Sandbox) -> None:
    lines = [f"{i:05d} " + "x" * 73 for i in range(500)]  # 500 lines of 80 bytes: 40 KB in one send
    keys = "cat > /tmp/big.txt <<'EOF'\n" + "\n".join(lines) + "\nEOF\n"
    step(run, sandbox, keys, 30)
    data = run(sandbox.read_file("/tmp/big.txt"))
    assert data == ("\n".join(lines) + "\n").encode()


def test_endless_output_is_capped_and_interruptible(run: Runner, sandbox: Sandbox) -> None:
    assert run(sandbox.terminal.send("yes endless\n", 1.0)) >= 0.95
    assert run(sandbox.terminal.send("C-c", 10)) < 5
    output = run(sandbox.terminal.capture_new())
    assert output.omitted_bytes > 0
    assert len(output.text.encode()) < 10_300
    assert f"{output.omitted_bytes} interior bytes omitted" in output.text
    _, text = step(run, sandbox, "echo after-yes\n", 5)
    assert "\nafter-yes\n" in text


def test_output_of_a_loop_of_builtins_is_new_output_not_the_screen(run: Runner) -> None:
    """The shell is its own foreground job while it runs a loop of builtins, so the wait may end while the output
    still scrolls; the turn looks again until it stops, within its wait (before, such a turn, and the next, showed
    the 40-line screen: 5 turns of 8 at a load of 8). A sandbox of its own: a history that another test filled to
    its limit drops lines as this output comes, which is another matter."""
    sandbox = run(Sandbox.start(SPEC))
    try:
        loop = 'for i in $(seq 1 3000); do echo "loop line $i of the builtin loop"; done\n'
        run(sandbox.terminal.capture_new())  # the position new output starts from
        for n in range(4):
            turn = run(sandbox.terminal.step([(loop, 2.0)]))
            assert not turn.output.is_screen, f"turn {n} (waited {turn.waited[0]:.3f} s) showed the screen"
            assert turn.output.omitted_bytes > 0 and "loop line" in turn.output.text  # new output, capped
            assert turn.waited[0] < 1.9
    finally:
        run(sandbox.close())


def test_clear_shows_the_screen(run: Runner, sandbox: Sandbox) -> None:
    step(run, sandbox, "echo before-clear\n", 5)
    run(sandbox.terminal.send("clear\n", 5))
    output = run(sandbox.terminal.capture_new())
    assert output.is_screen
    assert "before-clear" not in output.text
    assert output.text.strip().endswith("#")
    screen = run(sandbox.terminal.screen())
    assert len(screen.split("\n")) <= 40 and "before-clear" not in screen


def test_nothing_new_gives_the_screen(run: Runner, sandbox: Sandbox) -> None:
    run(sandbox.terminal.capture_new())
    output = run(sandbox.terminal.capture_new())
    assert output.is_screen


@pytest.mark.parametrize(
    "keys",
    ["\x00echo nul\n", "echo bad\udcff\udc80bytes\n", "echo bell\x07\n", "\x1b[A\x1b[B", "\t\t", "C-", "M-"],
    ids=["nul", "surrogates", "control-char", "escape-seq", "tabs", "bare-C-", "bare-M-"],
)
def test_bad_keystrokes_do_not_break_the_terminal(run: Runner, sandbox: Sandbox, keys: str) -> None:
    step(run, sandbox, keys, 1)
    step(run, sandbox, "C-c", 1)
    _, text = step(run, sandbox, "echo still-fine\n", 5)
    assert "\nstill-fine\n" in text


def test_surrogates_are_typed_as_replacement_characters(run: Runner, sandbox: Sandbox) -> None:
    _, text = step(run, sandbox, "echo A\udcffB\n", 5)
    assert "\nA\ufffdB\n" in text


def test_exit_makes_the_terminal_gone(run: Runner) -> None:
    sandbox = run(Sandbox.start(SPEC))
    try:
        with pytest.raises(TerminalGone):
            run(sandbox.terminal.send("exit\n", 5))
            run(sandbox.terminal.capture_new())
        with pytest.raises(TerminalGone):
            run(sandbox.terminal.send("echo again\n", 1))
    finally:
        run(sandbox.close())


def test_a_shell_that_dies_as_it_starts_is_the_infrastructures_error_not_the_agents(tmp_path: Path) -> None:
    """The login shell ends before the agent exists (here the image's /etc/profile exits): the start fails with a
    SandboxError that no one may read as the agent's doing (TerminalGone is the agent's)."""
    (tmp_path / "Dockerfile").write_text(
        f"FROM {SPEC.image}\nRUN echo 'exit 3' >> /etc/profile\nLABEL test-run={uuid.uuid4().hex}\n"
    )  # a tag of this run's own: another run of this test may remove its tag at any moment
    tag = ensure_image(tmp_path, "sandbox-test-shell-dies")
    client = docker.from_env()
    try:
        with pytest.raises(SandboxError) as failure:
            asyncio.run(Sandbox.start(SandboxSpec(tag)))
        assert not isinstance(failure.value, AgentCaused)
        assert "login shell ended as it started" in str(failure.value)
    finally:
        client.images.remove(tag, force=True)
        client.close()


def test_a_killed_container_is_a_lost_sandbox_not_the_agents_doing(run: Runner) -> None:
    sandbox = run(Sandbox.start(SPEC))
    try:
        client = docker.from_env()
        client.api.kill(sandbox.id)
        client.close()
        deadline = time.monotonic() + 20
        with pytest.raises(SandboxLost):
            while time.monotonic() < deadline:
                run(sandbox.terminal.send("echo x\n", 0.5))
        assert not sandbox.alive
    finally:
        run(sandbox.close())


def test_terminal_recovers_when_its_tmux_control_client_dies(run: Runner, sandbox: Sandbox) -> None:
    """The daemon's control client is out of the agent's sight (its own PID namespace), but the agent can still
    detach it through the tmux server; the daemon then attaches a new one."""
    step(run, sandbox, "echo before-control-loss\n", 5)  # the daemon attaches its control client on first use
    unseen = run(sandbox.exec("pkill -f 'tmu[x] -L terminus -f /dev/null -C'; echo status=$?", 5))
    assert unseen.output == "status=1\n", unseen
    detached = run(sandbox.exec("tmux -L terminus detach-client -s main && echo detached", 5))
    assert detached.output == "detached\n", detached
    _, text = step(run, sandbox, "echo after-control-loss\n", 5)
    assert "\nafter-control-loss\n" in text
    client = docker.from_env()
    try:
        clients = client.containers.get(sandbox.id).exec_run(["pgrep", "-fc", "tmu[x] -L terminus -f /dev/null -C"])
    finally:
        client.close()
    assert clients.output.decode().strip() == "1", "a new control client serves the terminal, seen from outside"


def test_terminal_runs_as_the_spec_user(run: Runner) -> None:
    for sandbox in sandbox_on(run, SandboxSpec(SPEC.image, user="nobody", workdir="/tmp")):
        _, text = step(run, sandbox, "id -un; pwd\n", 5)
        assert "\nnobody\n/tmp\n" in text
        assert run(sandbox.exec("id -un", 5)).output == "nobody\n"
        assert run(sandbox.exec("id -un", 5, user="root")).output == "root\n"


def test_a_turn_runs_in_one_step_and_stops_where_the_budget_does(run: Runner, sandbox: Sandbox) -> None:
    """`Terminal.step` types each command and waits for it in turn, in one request, then reads what is new; a command
    the agent's time budget does not reach is not typed at all."""
    turn = run(sandbox.terminal.step([("echo one\n", 5), ("C-c", 1), ("echo two\n", 5)]))
    assert len(turn.waited) == 3 and all(waited < 3 for waited in turn.waited)
    assert "\none\n" in turn.output.text and "\ntwo\n" in turn.output.text and not turn.output.is_screen
    budgeted = run(sandbox.terminal.step([("sleep 2; echo slow\n", 10), ("echo never\n", 5)], budget=1.0))
    assert len(budgeted.waited) == 1 and 0.9 <= budgeted.waited[0] < 2
    run(sandbox.terminal.send("C-c", 2))
    assert "never" not in run(sandbox.terminal.capture_new()).text
