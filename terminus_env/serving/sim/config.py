"""What a simulated replica is: vLLM's engine arguments and the step-time model, and the curves a shared host adds.

Kept apart from the engine (``engine.py``), which reads it: a calibration writes one, the simulated server's command
line carries it (one flag per field, a :data:`Curve` written ``x:y,x:y``).
"""

from __future__ import annotations

from dataclasses import dataclass

Curve = tuple[tuple[float, float], ...]
"""Points ``(requests open at the replica, value)`` in rising order: linear between them, flat beyond the ends."""


def curve_at(curve: Curve, x: float, default: float) -> float:
    """``curve``'s value at ``x``; ``default`` for an empty curve."""
    if not curve:
        return default
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def parse_curve(text: str) -> Curve:
    """A curve from ``"x:y,x:y"`` (the simulated server's command line); ``""`` is the empty curve."""
    try:
        return tuple((float(x), float(y)) for x, y in (pair.split(":") for pair in text.split(",") if pair))
    except ValueError:
        raise ValueError(f"a curve is written x:y,x:y,... with numbers, not {text!r}") from None


def format_curve(curve: Curve) -> str:
    return ",".join(f"{x:g}:{y:g}" for x, y in curve)


def _checked_curve(name: str, points: object) -> Curve:
    curve = tuple((float(x), float(y)) for x, y in points)  # type: ignore[attr-defined]
    xs = [x for x, _ in curve]
    if any(b <= a for a, b in zip(xs, xs[1:])) or any(y < 0 for _, y in curve):
        raise ValueError(f"SimConfig.{name} needs rising x and values >= 0, got {curve}")
    if name == "step_contention" and any(y == 0 for _, y in curve):
        raise ValueError(f"SimConfig.step_contention multiplies step times: 0 would stop time, got {curve}")
    return curve


@dataclass(frozen=True)
class SimConfig:
    """Engine arguments and the step-time model.

    A step lasts ``step_base_s + step_per_token_s × scheduled tokens + step_per_seq_s × scheduled
    sequences + step_per_context_token_s × KV tokens read + step_per_token_pair_s × (token, earlier
    token) pairs attended``. Scheduled tokens are the uncached prompt tokens of prefill chunks plus one
    per decoding sequence, so prefix-cache hits cost nothing. Each scheduled sequence reads its whole
    context's KV once (memory-bound decode); each scheduled token attends to every earlier token
    (compute-bound prefill, quadratic in its length). Defaults are in the range of a 7-8B model in bf16
    on one H100-class GPU: ~8 ms per step at batch 1, ~35k prefill tokens/s at short context (a 32k
    prompt in ~1.5 s), ~30 ms decode steps at batch 256.

    Replicas that share a host's cores with their HTTP servers and their clients (vLLM on a CPU) step at a speed
    that depends on the load, and lose time a dedicated accelerator does not: ``step_contention`` multiplies every
    step's time and ``frontend_s`` holds a request before the engine sees it, both read off a :data:`Curve` of the
    requests open at the replica (those its server holds, engine and frontend together). Both are empty (the
    model's times as they are) unless a run measured them.
    """

    num_gpu_blocks: int = 4096
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 32768
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    step_base_s: float = 0.008
    step_per_token_s: float = 25e-6
    step_per_seq_s: float = 50e-6
    step_per_context_token_s: float = 30e-9
    step_per_token_pair_s: float = 1.3e-12
    vocab_size: int = 32000
    step_contention: Curve = ()  # requests open -> step-time multiplier
    frontend_s: Curve = ()  # requests open -> seconds a request spends before the engine sees it

    def __post_init__(self) -> None:
        for name in ("step_contention", "frontend_s"):  # JSON gives lists: keep the curves hashable and checked
            object.__setattr__(self, name, _checked_curve(name, getattr(self, name)))
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"SimConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_gpu_blocks < 2:
            raise ValueError("SimConfig.num_gpu_blocks must be at least 2 (one is the reserved null block)")
        usable_tokens = (self.num_gpu_blocks - 1) * self.block_size
        if self.max_model_len > usable_tokens:
            raise ValueError(
                f"max_model_len={self.max_model_len} does not fit the KV pool of {usable_tokens} tokens; "
                "raise num_gpu_blocks or lower max_model_len (vLLM refuses to start in this case too)"
            )
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={self.max_num_batched_tokens} is below max_model_len={self.max_model_len} "
                "with chunked prefill off: a long prompt could never be scheduled (vLLM refuses this too)"
            )

    @property
    def usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1
