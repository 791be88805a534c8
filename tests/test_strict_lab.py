"""The strict-against-lenient experiment's own parts that need neither a model nor Docker: the demonstrations' turns,
the advantages the analysis credits to broken openings, the figure."""

from __future__ import annotations

import pytest
from strict_lab import analysis, demos
from strict_lab.figure import plot

from terminus_env.protocol import parse_reply
from terminus_env.tasks import find_task


def test_solution_commands_are_what_a_person_types():
    assert demos.solution_commands(find_task("hello-world")) == ["echo 'Hello, world!' > /app/hello.txt\n"]
    deb = demos.solution_commands(find_task("install-deb-offline"))
    assert deb == ["dpkg -i /opt/debs/*.deb\n", "jq -r .port /app/config.json > /app/port.txt\n"]  # no set -e
    continued = demos.solution_commands(find_task("top-error-ips"))
    assert len(continued) == 1 and continued[0].count("\n") == 2 and "\\\n  | awk" in continued[0]


@pytest.mark.parametrize("name", ["hello-world", "top-error-ips", "dotenv-settings"])
def test_the_solution_turn_parses_to_the_solution_and_its_broken_twin_is_rejected(name):
    task = find_task(name)
    parsed = parse_reply(demos.solution_reply(task))
    assert parsed.error is None and parsed.warnings == [] and parsed.task_complete
    assert [c.keystrokes for c in parsed.commands] == demos.solution_commands(task)
    broken = parse_reply(demos.broken_opening(demos.solution_reply(task)))
    assert broken.error is not None and "<response>" in broken.error
    confirm = parse_reply(demos.confirm_reply())
    assert confirm.error is None and confirm.warnings == [] and confirm.task_complete and not confirm.commands


def _row(group: int, reward: float, *, broken: bool = False, env_error: bool = False) -> dict:
    return {"step": 1, "group": group, "reward": reward, "env_error": env_error, "first_turn_rejected": broken,
            "format_errors": int(broken), "format_error_opening_streak": int(broken), "rescued": broken and reward > 0,
            "truncated_turns": 0, "turns": 2 + broken, "end_reason": "task_complete"}  # fmt: skip


def test_advantages_are_trls_group_normalised_rewards():
    rows = [_row(0, 1.0), _row(0, 0.0), _row(0, 0.0), _row(0, 0.0), _row(1, 1.0), _row(1, 1.0)]
    got = analysis.advantages(rows)
    # group 0: mean 0.25, standard deviation with Bessel's correction 0.5; group 1: all equal, advantage 0
    assert got[:4] == pytest.approx([0.75 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001, -0.25 / 0.5001])
    assert got[4:] == [0.0, 0.0]


def test_a_rescued_rollout_that_beats_its_group_pushes_the_broken_opening_up():
    lenient = [_row(0, 1.0, broken=True), _row(0, 0.0), _row(0, 0.0), _row(0, 1.0)]
    metrics = analysis.step_metrics(lenient, probe=0.1)
    assert metrics["rescued"] == 1 and metrics["rescued_won"] == 1 and metrics["broken_opening_advantage"] > 0
    assert metrics["mean_format_errors"] == 0.25 and metrics["rescued_rate"] == 0.25 and metrics["mixed_groups"] == 1
    totals = analysis.totals([{"steps": [metrics]}])
    assert totals["reward_after_broken_opening"] == 1.0 and totals["reward_after_clean_opening"] == pytest.approx(1 / 3)
    strict = [_row(0, 0.0, broken=True), _row(0, 1.0), _row(0, 0.0), _row(0, 1.0)]  # the same error, ended at once
    metrics = analysis.step_metrics(strict, probe=0.1)
    assert metrics["rescued"] == 0 and metrics["broken_opening_advantage"] < 0


def test_a_masked_rollout_is_out_of_its_group_and_of_the_means():
    rows = [_row(0, 1.0), _row(0, 0.0), _row(0, 0.0, broken=True, env_error=True)]
    assert analysis.advantages(rows)[2] is None
    metrics = analysis.step_metrics(rows, probe=None)
    assert metrics["env_errors"] == 1 and metrics["mean_reward"] == 0.5 and metrics["broken_openings"] == 0


def test_the_figure_draws_every_series_for_both_arms(tmp_path):
    def run(level: float) -> dict:
        steps = [{"step": s, **dict.fromkeys([k for k, _ in analysis.SERIES], level * s)} for s in (1, 2, 3)]
        return {"steps": steps}

    path = tmp_path / "figure.png"
    plot({"strict": [run(0.1), run(0.2)], "lenient": [run(0.3), run(0.4)]}, path, "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert analysis.arm_bands([run(0.1), run(0.3)], "mean_reward") == (
        [1, 2, 3], pytest.approx([0.2, 0.4, 0.6]), pytest.approx([0.1, 0.2, 0.3]), pytest.approx([0.3, 0.6, 0.9])
    )  # fmt: skip


def test_every_container_hostname_gets_a_fresh_random_one_the_same_throughout():
    import random

    from strict_lab import sft

    messages = [
        {"role": "user", "content": "Current terminal screen:\nroot@942b0081d848:/app#"},
        {"role": "assistant", "content": "<response>email me@abcdefabcdef.org</response>"},  # not a shell prompt
        {"role": "user", "content": "root@942b0081d848:/app# ls\nroot@942b0081d848:/app#"},
    ]
    fresh = sft._fresh_hosts(demos.Demo("hello-world", False, messages), random.Random(0))
    hosts = {h for m in fresh.messages for h in sft.HOSTNAME.findall(m["content"])}
    assert len(hosts) == 1 and "942b0081d848" not in hosts
    assert fresh.messages[1] == messages[1]
    assert fresh.messages[2]["content"] == messages[2]["content"].replace("942b0081d848", hosts.pop())


def test_the_dry_run_checks_the_gpu_recipe_and_starts_nothing(capsys):
    import json

    import strict_vs_lenient

    assert strict_vs_lenient.main(["--gpu", "--dry-run", "--steps", "10"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["device"] == "gpu" and plan["problems"] == [] and plan["rollouts_per_step"] == 32
    assert plan["start"]["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and len(plan["runs"]) == 6
    assert {r["output"].rsplit("/", 1)[1] for r in plan["runs"]} == {f"{a}-seed{s}" for a in ("strict", "lenient")
                                                                      for s in range(3)}  # fmt: skip
    assert all(r["steps"] == 10 for r in plan["runs"])  # an explicit flag wins over the recipe
    assert plan["serve_env"]["CUDA_VISIBLE_DEVICES"] == "1,2" and "--weight-sync" in plan["serve"]
    assert strict_vs_lenient.main(["--gpu", "--dry-run", "--max-turn-tokens", "8192"]) == 1  # does not fit
    assert "do not fit --max-model-len" in json.loads(capsys.readouterr().out)["problems"][0]
