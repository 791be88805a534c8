"""How hard a format fault hits: end the episode (strict) or tell the model and go on (lenient).

Training is strict by default so that no rollout with a rejected or overlong turn ever earns
reward (RL would otherwise reinforce the fault whenever the model recovers from it). Evaluation
is lenient by default so that scores stay comparable with published Terminal-Bench results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from terminus_env.config import (
    EVAL_STRICT_FORMAT,
    EVAL_STRICT_TRUNCATION,
    STRICT_FORMAT,
    STRICT_TRUNCATION,
    env_flag,
)

# mode -> (format variable, truncation variable, default for both)
_MODES = {
    "train": (STRICT_FORMAT, STRICT_TRUNCATION, True),
    "eval": (EVAL_STRICT_FORMAT, EVAL_STRICT_TRUNCATION, False),
}


@dataclass(frozen=True)
class Strictness:
    """strict_format: a rejected turn ends the episode with reward 0, ungraded.
    strict_truncation: a turn that fills the per-turn token limit does the same, with no salvage."""

    strict_format: bool
    strict_truncation: bool

    @property
    def label(self) -> str:
        """"strict", "lenient", or which of the two is strict, for a person to read."""
        if self.strict_format == self.strict_truncation:
            return "strict" if self.strict_format else "lenient"
        return "strict format, lenient truncation" if self.strict_format else "lenient format, strict truncation"

    @classmethod
    def from_env(
        cls,
        mode: str = "train",
        *,
        strict_format: bool | None = None,
        strict_truncation: bool | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> Strictness:
        """Settings for ``mode`` ("train" or "eval"); explicit arguments win over the variables.

        Raises terminus_env.config.ConfigError (a ValueError) naming the variable if it holds
        something other than 0/1/true/false, and ValueError for an unknown mode.
        """
        if mode not in _MODES:
            raise ValueError(f"unknown strictness mode {mode!r}: use 'train' or 'eval'")
        format_var, truncation_var, default = _MODES[mode]
        if strict_format is None:
            strict_format = env_flag(format_var, default, environ)
        if strict_truncation is None:
            strict_truncation = env_flag(truncation_var, default, environ)
        return cls(strict_format=strict_format, strict_truncation=strict_truncation)
