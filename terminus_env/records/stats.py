"""Scores over many rollouts: pass@k, and the mean reward with a 95% confidence interval.

Pure: trials in, numbers out. The score is the one the Terminal-Bench leaderboard ranks by:
1. each task's score is its mean reward over its trials;
2. the benchmark score is the mean of the task scores;
3. its standard error is ``sqrt(sum of p(1 - p) / (n - 1) over the tasks) / T``, for T tasks with
   score p over n trials each, so only the trials' randomness counts (the task set is fixed);
4. the 95% interval is the score ± 1.96 standard errors, clipped to [0, 1].

It needs two trials of every task; with one, there is no interval (the leaderboard shows none).
Trials that failed for the infrastructure (``valid=False``: env errors, a task that did not load
or build) are left out, as the leaderboard leaves out trials that raised anything but a timeout.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SUCCESS_REWARD = 1.0
"""A trial counts as solved for pass@k when its reward reaches this."""
Z_95 = 1.96
"""The two-sided 95% quantile of the normal distribution, as on the leaderboard."""


@dataclass(frozen=True)
class Trial:
    """One finished rollout, as the scores see it."""

    task: str
    reward: float
    end_reason: str
    valid: bool = True
    """False when the infrastructure failed (not the agent): left out of every score."""
    category: str | None = None


@dataclass(frozen=True)
class TaskScore:
    task: str
    category: str | None
    trials: int
    """Valid trials: the ones scored."""
    solved: int
    invalid: int
    mean_reward: float | None
    pass_at_1: float | None
    pass_at_k: float | None
    """None when the task has fewer than k valid trials."""
    end_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def variance_term(self) -> float | None:
        """This task's share of the leaderboard's variance: p(1 - p) / (n - 1), or None with n < 2."""
        if self.mean_reward is None or self.trials < 2:
            return None
        return self.mean_reward * (1.0 - self.mean_reward) / (self.trials - 1)


@dataclass(frozen=True)
class Score:
    """A set of tasks summed up: overall, or one category."""

    tasks: int
    """Tasks with at least one valid trial: the ones scored."""
    unscored: tuple[str, ...]
    mean_reward: float | None
    stderr: float | None
    """None unless every scored task has two valid trials or more."""
    ci95: tuple[float, float] | None
    pass_at_1: float | None
    pass_at_k: float | None
    pass_at_k_tasks: int
    """How many tasks had k valid trials, so count in pass@k."""


@dataclass(frozen=True)
class Report:
    k: int
    tasks: tuple[TaskScore, ...]
    overall: Score
    categories: dict[str, Score]
    end_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def rollouts(self) -> int:
        return sum(t.trials + t.invalid for t in self.tasks)

    @property
    def invalid(self) -> int:
        return sum(t.invalid for t in self.tasks)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimator of pass@k from n trials with c solved: 1 - C(n - c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def task_score(task: str, trials: Sequence[Trial], k: int) -> TaskScore:
    """One task's numbers from its trials (all of them, valid or not)."""
    valid = [t for t in trials if t.valid]
    n = len(valid)
    solved = sum(1 for t in valid if t.reward >= SUCCESS_REWARD)
    category = next((t.category for t in trials if t.category is not None), None)
    return TaskScore(
        task=task,
        category=category,
        trials=n,
        solved=solved,
        invalid=len(trials) - n,
        mean_reward=sum(t.reward for t in valid) / n if n else None,
        pass_at_1=solved / n if n else None,
        pass_at_k=pass_at_k(n, solved, k) if n >= k else None,
        end_reasons=dict(sorted(Counter(t.end_reason for t in trials).items())),
    )


def score(tasks: Sequence[TaskScore]) -> Score:
    """The leaderboard's mean and standard error over the tasks that have a valid trial."""
    scored = [t for t in tasks if t.trials > 0]
    unscored = tuple(t.task for t in tasks if t.trials == 0)
    with_k = [t.pass_at_k for t in scored if t.pass_at_k is not None]
    if not scored:
        return Score(0, unscored, None, None, None, None, None, 0)
    mean = _mean([t.mean_reward for t in scored if t.mean_reward is not None])
    terms = [t.variance_term for t in scored]
    stderr = None if any(v is None for v in terms) else math.sqrt(sum(v for v in terms if v is not None)) / len(scored)
    ci95 = None if stderr is None else (max(0.0, mean - Z_95 * stderr), min(1.0, mean + Z_95 * stderr))
    return Score(
        tasks=len(scored),
        unscored=unscored,
        mean_reward=mean,
        stderr=stderr,
        ci95=ci95,
        pass_at_1=_mean([t.pass_at_1 for t in scored if t.pass_at_1 is not None]),
        pass_at_k=_mean(with_k) if with_k else None,
        pass_at_k_tasks=len(with_k),
    )


def report(trials: Iterable[Trial], k: int, task_order: Sequence[str] = ()) -> Report:
    """Per task, per category and overall; tasks in ``task_order`` first, then the rest by name."""
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    by_task: dict[str, list[Trial]] = {}
    for trial in trials:
        by_task.setdefault(trial.task, []).append(trial)
    order = [name for name in task_order if name in by_task] + sorted(set(by_task) - set(task_order))
    tasks = tuple(task_score(name, by_task[name], k) for name in order)
    categories: dict[str, list[TaskScore]] = {}
    for task in tasks:
        categories.setdefault(task.category or "-", []).append(task)
    end_reasons = Counter(t.end_reason for group in by_task.values() for t in group)
    return Report(
        k=k,
        tasks=tasks,
        overall=score(tasks),
        categories={name: score(group) for name, group in sorted(categories.items())},
        end_reasons=dict(end_reasons.most_common()),
    )


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)
