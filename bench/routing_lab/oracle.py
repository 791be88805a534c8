"""The clairvoyant admission order: the reference makespan the routing targets are measured against."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from terminus_env.serving.admission import AdaptiveAdmission


class OracleAdmission(AdaptiveAdmission):
    """Adaptive admission that admits the waiter with the longest true critical path first.

    Nobody knows a rollout's length before it runs; this controller is told (``critical_paths``, the
    rollout alone on an empty replica), so its makespan is what the best admission order of this
    mechanism reaches. For experiments and references only.
    """

    def __init__(self, like: AdaptiveAdmission, critical_paths: Mapping[str, float]) -> None:
        super().__init__(like.pipeline_cap, like.prior_trace_tokens, horizon_turns=like.horizon_turns,
                         max_target_scale=like.max_target_scale)
        self.critical_paths = critical_paths

    def pick(self, waiting: Sequence[tuple[str, str | None]]) -> int:
        return max(range(len(waiting)), key=lambda i: self.critical_paths[waiting[i][0]])
