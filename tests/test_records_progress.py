"""The eval's progress: counts, a tqdm bar on a terminal, numbered lines elsewhere."""

from __future__ import annotations

import io

from terminus_env.records.progress import Progress, Tally


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_tally_counts_running_failed_errors_and_the_mean_of_scored_rollouts() -> None:
    tally = Tally(total=6, done=1)
    for _ in range(3):
        tally.started()
    tally.finished(1.0, error=False, solved=True)
    tally.finished(0.0, error=False, solved=False)
    tally.finished(0.0, error=True, solved=False, was_running=False, count=2)  # a task that did not load
    assert (tally.done, tally.running, tally.failed, tally.errors, tally.mean_reward) == (5, 1, 3, 2, 0.5)
    assert tally.describe() == "running 1 · failed 3 · errors 2 · mean reward 0.500"
    assert Tally(total=1).describe().endswith("mean reward -")


def test_a_terminal_gets_a_bar_with_the_counts() -> None:
    out, bar = io.StringIO(), Terminal()
    progress = Progress(Tally(total=4), out=out, bar_stream=bar)
    progress.started()
    progress.started()
    progress.finished("a #0: reward 1", 1.0, error=False, solved=True)
    progress.finished("b: could not load", 0.0, error=True, solved=False, was_running=False, count=2)
    progress.close()
    shown = bar.getvalue()
    assert "3/4" in shown and "running 1 · failed 2 · errors 2 · mean reward 1.000" in shown
    assert "b: could not load" in shown and out.getvalue() == ""  # errors print above the bar


def test_elsewhere_each_finished_rollout_is_a_numbered_line() -> None:
    out, log = io.StringIO(), io.StringIO()
    progress = Progress(Tally(total=12, done=9), out=out, bar_stream=log)
    progress.started()
    progress.finished("a #0: reward 1", 1.0, error=False, solved=True)
    progress.finished("b: could not load", 0.0, error=True, solved=False, was_running=False, count=2)
    progress.close()
    assert out.getvalue() == "[10/12] a #0: reward 1\n[12/12] b: could not load\n" and log.getvalue() == ""
