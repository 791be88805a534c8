"""Numbers written as text by a model or a verifier, read the way JSON writes them.

Python's ``float()`` also takes ``1_0`` (ten), ``inf``, ``nan`` and ``infinity``; a duration or a reward
spelled that way is a mistake to report, not a value to act on.
"""

from __future__ import annotations

import re

_DECIMAL = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*")


def read_decimal(text: str) -> float | None:
    """The finite number ``text`` spells as a decimal (an exponent allowed), or None."""
    match = _DECIMAL.fullmatch(text)
    if match is None:
        return None
    value = float(match.group(1))  # the number alone: the regex's spaces (\x1c-\x1f among them) are not float()'s
    return value if value not in (float("inf"), float("-inf")) else None
