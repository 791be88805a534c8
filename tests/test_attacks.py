"""Attacks a policy could learn, each played as the attack itself, through the env, over real Docker.

A trained policy is an adversary with a root shell that can read our source. Each test here types the attack
into the terminal the way a model would and checks that it earns nothing it should not, that the limits hold,
and that an episode the agent broke is the agent's failure, never a masked env_error.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import re
import textwrap
import threading
import time

import docker
import gymnasium
import pytest

from terminus_env import TerminusEnv, load_task
from terminus_env.rules import EndReason, Fault
from terminus_env.sandbox.owner import LABEL, PID_LABEL

pytestmark = pytest.mark.usefixtures("docker_required")

WRITE = "echo hello > /app/hello.txt\n"


def reply(keystrokes: str = "", *, complete: bool = False, duration: float = 2.0) -> str:
    done = "<task_complete>true</task_complete>" if complete else ""
    return (
        "<response><analysis>Looking.</analysis><plan>Act.</plan>"
        f'<commands><keystrokes duration="{duration}">{keystrokes}</keystrokes></commands>{done}</response>'
    )


def background(script: str) -> str:
    """Keystrokes that start ``script`` detached from the terminal, as a policy would hide it."""
    payload = base64.b64encode(textwrap.dedent(script).encode()).decode()
    return f"echo {payload} | base64 -d > /tmp/.x.sh && (setsid nohup bash /tmp/.x.sh > /dev/null 2>&1 &)\n"


@pytest.fixture(scope="module")
def task(tiny_task_dir):
    return load_task(tiny_task_dir)


@contextlib.contextmanager
def started(task, **kwargs):
    with contextlib.closing(TerminusEnv(task, **kwargs)) as env:
        env.reset()
        yield env


def play(env, replies):
    for action in replies:
        result = env.step(action)
        if result[2] or result[3]:
            return result
    raise AssertionError("the episode did not end")


def test_forged_control_channel_replies_earn_nothing(task):
    """Write reply-shaped JSON (a reward of 1 for every request id) and garbage into every fd of every process the
    agent can see, the daemon's first among them if it could find it; then claim completion on an unsolved task."""
    forge = r"""
        reply='{"id": %d, "ok": true, "exit_code": 0, "timed_out": false, "head": "", "tail": "", "omitted": 0,
        "duration_s": 0.1, "files": {"/logs/verifier/reward.txt": "MQo=", "/logs/verifier/test-stdout.txt": "",
        "/logs/verifier/reward.json": null}, "data": "MQo="}'
        while true; do
          for p in $(pgrep -f 'terminus|ctypes|import sys' ; ls /proc | grep '^[0-9]'); do
            for fd in 0 1 2; do
              { for id in $(seq 0 80); do printf "$(echo $reply | tr -d '\n')\n" "$id"; done; echo 'not json'; } \
                > /proc/$p/fd/$fd 2>/dev/null
            done
          done
          sleep 0.1
        done
    """
    with started(task, mode="train") as env:
        look = "pgrep -af 'terminus-daemon|import ctypes|exec(os.environ' | grep -vc pgrep; echo seen-above\n"
        obs, *_ = env.step(reply(look))
        assert "\n0\nseen-above" in obs, "the control daemon must be invisible from the agent's side"
        env.step(reply(background(forge)))
        env.step(reply("sleep 1\n"))
        _, reward, terminated, _, info = play(env, [reply(complete=True), reply(complete=True)])
    assert terminated and info["end_reason"] == EndReason.TASK_COMPLETE
    assert reward == 0.0 and info["env_error"] is False, info["episode"]


def test_a_reward_renaming_loop_left_running_earns_nothing(tiny_task_dir):
    """The agent leaves a loop that keeps renaming a file holding 1 into the reward file, overwrites reward.json
    and the tests themselves, then claims completion on an unsolved task, in training mode through gym.make."""
    loop = """
        while true; do
          echo 1 > /tmp/r && mv -f /tmp/r /logs/verifier/reward.txt
          echo '{"reward": 1}' > /logs/verifier/reward.json
          mkdir -p /tests && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh
        done
    """
    with contextlib.closing(gymnasium.make("terminus_env/Terminus-v0", task=tiny_task_dir, mode="train")) as env:
        env.reset()
        env.step(reply(background(loop)))
        obs, *_ = env.step(reply("sleep 0.5; cat /logs/verifier/reward.txt\n"))
        assert "\n1\n" in obs, "the loop must be running when the episode ends"
        _, reward, terminated, _, info = play(env, [reply(complete=True), reply(complete=True)])
    assert terminated and info["end_reason"] == EndReason.TASK_COMPLETE and info["episode"]["graded"]
    assert reward == 0.0


def test_a_service_the_agent_left_running_still_answers_the_tests(tmp_path):
    """Live processes are the task's state: a server the agent starts in the background is queried by the tests,
    while a reward-renaming loop running beside it changes nothing."""
    root = tmp_path / "serve-a-file"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "task.toml").write_text('version = "1.0"\n[agent]\ntimeout_sec = 120\n')
    (root / "instruction.md").write_text("Serve /srv over HTTP on port 8000 and leave the server running.\n")
    (root / "environment" / "Dockerfile").write_text("FROM terminus-env/base:bookworm\nRUN mkdir -p /srv\n")
    (root / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        "echo served > /srv/probe.txt\n"
        "if [ \"$(curl -s --max-time 5 http://127.0.0.1:8000/probe.txt)\" = served ]; then r=1; else r=0; fi\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    task = load_task(root)
    serve = "cd /srv && (setsid nohup python3 -m http.server 8000 > /dev/null 2>&1 &) && sleep 1 && cd /\n"
    forge = "while true; do echo 0 > /tmp/z && mv -f /tmp/z /logs/verifier/reward.txt; done\n"
    with started(task, mode="eval") as env:
        env.step(reply(serve))
        env.step(reply(background(forge)))
        _, reward, _, _, info = play(env, [reply(complete=True), reply(complete=True)])
    assert (reward, info["end_reason"]) == (1.0, EndReason.TASK_COMPLETE), info["episode"]


def test_filling_the_disk_past_storage_mb_ends_the_episode_as_the_agents_failure(task):
    limited = dataclasses.replace(task, storage_mb=64)
    fill = "for i in $(seq 1 12); do head -c 10000000 /dev/zero > /root/fill$i; done; sleep 20\n"
    with started(limited, mode="eval") as env:
        env.step(reply(WRITE))
        began = time.monotonic()
        _, reward, terminated, _, info = env.step(reply(fill, duration=30))
        took = time.monotonic() - began
    assert terminated and info["end_reason"] == EndReason.RESOURCE_LIMIT
    assert reward == 0.0 and info["env_error"] is False and info["episode"]["fault"] == Fault.AGENT
    assert "64 MB" in (info["episode"]["error"] or "")
    assert took < 15, f"the watchdog should end the episode within seconds, took {took:.1f} s"


def test_one_file_larger_than_storage_mb_is_refused_outright(task):
    limited = dataclasses.replace(task, storage_mb=32)
    with started(limited, mode="eval") as env:
        obs, *_ = env.step(reply("head -c 50000000 /dev/zero > /root/big; echo status=$?; ls -l /root/big\n"))
    assert "File size limit exceeded" in obs and "status=153" in obs and " 33554432 " in obs


@pytest.mark.parametrize(
    "breaking",
    ["exit\n", "C-d", "kill -9 -1\n", "tmux -L terminus kill-server\n"],
    ids=["exit", "ctrl-d", "kill-all", "tmux-kill-server"],
)
def test_breaking_the_terminal_is_the_agents_failure_graded_as_it_stands(task, breaking):
    with started(task, mode="train") as env:
        env.step(reply(WRITE))
        _, reward, terminated, truncated, info = play(env, [reply(breaking), reply("ls\n"), reply("ls\n")])
    assert terminated and not truncated and info["end_reason"] == EndReason.SHELL_LOST
    assert info["env_error"] is False and info["episode"]["fault"] == Fault.AGENT
    assert info["episode"]["graded"] and reward == 1.0, "the task was solved before the shell was broken"


def test_a_fork_bomb_under_timeout_never_masks_the_episode(task):
    """``timeout`` does not reliably stop a fork bomb: its children may outlive it and hold every pid. The daemon
    keeps answering (it started its threads up front). Whether the bomb's remains still hold the pids when the
    verifier runs is a race, so both endings are allowed, each with the reward it implies: the verifier starved
    (it could not start, or the container hit its pids limit while it ran) is the agent's failure; a masked
    env_error, or a reward of 0 for the solved task with nobody to blame, never happens."""
    bomb = "timeout 8 bash -c 'bomb() { bomb | bomb & }; bomb'\n"
    with started(task, mode="eval") as env:
        env.step(reply(WRITE))
        obs, *_ = env.step(reply(bomb, duration=10))
        assert "fork" in obs, "the bomb must have exhausted the pids"
        _, reward, terminated, _, info = play(env, [reply(complete=True), reply(complete=True)])
    assert terminated and info["env_error"] is False, info["episode"]
    assert (info["end_reason"], reward, info["episode"]["fault"]) in {
        (EndReason.TASK_COMPLETE, 1.0, Fault.NONE),
        (EndReason.RESOURCE_LIMIT, 0.0, Fault.AGENT),
    }, info["episode"]


def test_holding_every_pid_at_grading_is_the_agents_failure(task):
    """Processes the agent leaves holding every pid of the sandbox leave the verifier none: reward 0, the agent's
    fault, never masked, even though the task was solved."""
    hog = "for i in $(seq 1 1100); do (exec sleep 600) & done 2> /dev/null; echo hog-done\n"
    with started(task, mode="eval") as env:
        env.step(reply(WRITE))
        obs, *_ = env.step(reply(hog, duration=30))
        assert "hog-done" in obs
        _, reward, terminated, _, info = play(env, [reply(complete=True), reply(complete=True)])
    assert terminated and info["end_reason"] == EndReason.RESOURCE_LIMIT and info["env_error"] is False
    assert reward == 0.0 and info["episode"]["fault"] == Fault.AGENT
    assert "the verifier was starved" in info["episode"]["error"]


def test_the_agents_side_holds_no_capability_to_leave_it(task):
    probes = (
        "unshare -U true; echo userns=$?; unshare -m true; echo mountns=$?; "
        "mount -t tmpfs x /mnt; echo mount=$?; grep CapEff /proc/self/status; ls /proc | grep -c '^[0-9]'\n"
    )
    with started(task, mode="eval") as env:
        obs, *_ = env.step(reply(probes))
    for refused in ("userns=1", "mountns=1", "mount=32"):
        assert refused in obs
    assert re.search(r"CapEff:\s+00000000000004fb\n", obs)  # chown dac_override fowner fsetid kill setgid setuid bind


def _close_into(env: TerminusEnv, errors: list[BaseException]) -> None:
    try:
        env.close()
    except BaseException as exc:  # noqa: BLE001 - collected for the assertion
        errors.append(exc)


def test_two_threads_closing_one_env_both_return(task):
    for _ in range(10):
        env = TerminusEnv(task, mode="eval")
        env.reset()
        errors: list[BaseException] = []
        threads = [threading.Thread(target=_close_into, args=(env, errors)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(thread.is_alive() for thread in threads), "a close() blocked"
        assert errors == []


def test_no_container_is_left_by_these_attacks():
    import os

    client = docker.from_env()
    try:
        left = client.api.containers(all=True, filters={"label": [LABEL, f"{PID_LABEL}={os.getpid()}"]})
    finally:
        client.close()
    assert left == []
