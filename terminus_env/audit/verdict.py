"""What one exploit's episode means, in both modes, and where its way to the reward runs: pure functions.

The audit plays each exploit once, in eval mode, where the verifier's reward stands and the watch's findings are
reported beside it. Train mode's reward follows from those two by the env's own rule (:func:`train_outcome`, which
is :func:`terminus_env.rules.tamper_ending`): any finding ends the episode ``tampered`` with reward 0. So one
episode gives both verdicts.

An exploit *earns* in a mode when its reward there is above what doing nothing earns in the same mode: a task whose
rubric pays something for an untouched container is not hacked by an exploit that earns the same. Doing nothing
itself passes only when it earns the full reward: the tests pass before the task is done.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from terminus_env.audit.exploits import Channel, Exploit
from terminus_env.records.stats import SUCCESS_REWARD
from terminus_env.rules import EndReason, Fault, TamperPolicy, tamper_ending
from terminus_env.utils.named import Named

EPSILON = 1e-9
VERIFIER_TIMED_OUT = "verifier timed out"
"""How the grade's reason begins when the verifier ran out of time (``terminus_env.tasks.grading.grade``)."""


class Verdict(Named):
    """How an exploit fared on a task."""

    HELD = "held"
    """It earned nothing more than doing nothing, in either mode."""
    CAUGHT = "caught"
    """The verifier paid it (eval keeps that reward and lists the findings), and a finding zeroes it in train mode."""
    PASSED = "passed"
    """It earned the reward in train mode: the task is hackable, or the runtime let it through."""
    NOT_APPLICABLE = "n/a"
    """The container held nothing it could work on (no module, no program): not played."""
    ERROR = "error"
    """The episode could not be judged: the sandbox or Docker failed."""


@dataclass(frozen=True)
class Episode:
    """What one play of an exploit gave, in eval mode."""

    reward: float | None
    """The verifier's reward (None when the episode did not end)."""
    end_reason: str | None
    findings: tuple[Mapping[str, object], ...] = ()
    error: str | None = None
    """What failed, when the episode did not end or the infrastructure ended it."""
    grade_reason: str | None = None
    """Why the verifier's reward is what it is, when it did not say so itself (``EpisodeSummary.grade_reason``)."""

    @property
    def timed_out(self) -> bool:
        """The verifier ran out of time: a 0 that says nothing of the exploit (a loaded host, a slow build)."""
        return (self.grade_reason or "").startswith(VERIFIER_TIMED_OUT)

    @property
    def judged(self) -> bool:
        """It ended, not by the infrastructure's fault (whatever the agent's side did is judged), and its verifier
        finished."""
        ended = self.end_reason is not None and EndReason(self.end_reason).fault is not Fault.INFRASTRUCTURE
        return ended and not self.timed_out


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    placement: Channel | None = None
    """Where the way to the reward runs, for an exploit that earned it (``PASSED``, ``CAUGHT``)."""
    fix: str | None = None
    """The task author's fix in one sentence, when the placement is the task's verifier."""
    train_reward: float | None = None
    train_end_reason: str | None = None


def train_outcome(episode: Episode) -> tuple[float | None, str | None]:
    """Train mode's reward and ending for the same episode: the env's own rule applied to the findings."""
    if episode.end_reason is None:
        return None, None
    reason = EndReason(episode.end_reason)
    ending = tamper_ending(episode.findings, TamperPolicy.FAIL) if reason.graded else None
    if ending is not None:
        return 0.0, ending.value
    return episode.reward, reason.value


def judge_task(
    exploits: Sequence[Exploit], episodes: Mapping[str, Episode], targets: Mapping[str, tuple[str, ...]]
) -> dict[str, Judgement]:
    """Every exploit's judgement on one task. ``episodes`` holds the played ones by name (the first exploit is the
    control, doing nothing); an exploit without an episode had nothing to work on. Exploits aimed at the task's
    verifier are judged first, so that a runtime exploit whose control passed too is placed with its control."""
    control = exploits[0]
    baseline = episodes.get(control.name)
    eval_floor, train_floor = 0.0, 0.0
    judgements: dict[str, Judgement] = {}
    ordered = sorted(exploits, key=lambda e: (e is not control, e.channel is Channel.RUNTIME))
    for exploit in ordered:
        episode = episodes.get(exploit.name)
        if episode is None:
            judgements[exploit.name] = Judgement(Verdict.NOT_APPLICABLE)
            continue
        judgement = judge(exploit, episode, eval_floor, train_floor, targets.get(exploit.name, ()), judgements,
                          is_control=exploit is control)  # fmt: skip
        judgements[exploit.name] = judgement
        if exploit is control and baseline is not None and baseline.judged:
            eval_floor = baseline.reward or 0.0
            train_floor = judgement.train_reward or 0.0
    return {exploit.name: judgements[exploit.name] for exploit in exploits}


def judge(
    exploit: Exploit,
    episode: Episode,
    eval_floor: float,
    train_floor: float,
    targets: tuple[str, ...],
    others: Mapping[str, Judgement],
    *,
    is_control: bool = False,
) -> Judgement:
    """One exploit's judgement: ``*_floor`` is what doing nothing earned in each mode; ``others`` the judgements
    made so far (a runtime exploit's control among them); ``is_control``: this is doing nothing itself."""
    if not episode.judged:
        return Judgement(Verdict.ERROR)
    train_reward, train_end = train_outcome(episode)
    if is_control:  # a rubric may pay something for an untouched container: only all of it is a pass
        eval_floor = train_floor = SUCCESS_REWARD - 2 * EPSILON
    earned_eval = (episode.reward or 0.0) > eval_floor + EPSILON
    earned_train = (train_reward or 0.0) > train_floor + EPSILON
    if earned_train:
        placement, fix = place(exploit, targets, others)
        return Judgement(Verdict.PASSED, placement, fix, train_reward, train_end)
    if earned_eval:
        return Judgement(Verdict.CAUGHT, Channel.RUNTIME, None, train_reward, train_end)
    return Judgement(Verdict.HELD, None, None, train_reward, train_end)


def place(exploit: Exploit, targets: tuple[str, ...], others: Mapping[str, Judgement]) -> tuple[Channel, str | None]:
    """Where a passing exploit's way runs: its own channel, unless it is a runtime exploit whose control (the same
    effect on the task's code, without the trick) passed too, when the task's verifier let both through."""
    control = others.get(exploit.control) if exploit.control else None
    if exploit.channel is Channel.RUNTIME and control is not None and control.verdict is Verdict.PASSED:
        return Channel.VERIFIER, control.fix
    if exploit.channel is Channel.VERIFIER:
        return Channel.VERIFIER, exploit.fix(targets) if exploit.fix else None
    return Channel.RUNTIME, None
