"""The env's observation and action space: text over the basic multilingual plane, at most ``MAX_TEXT_LENGTH`` long.

Gymnasium's ``Text`` space checks every character against its charset, so what the env hands out must fit it:
:func:`fit` makes any text do so.
"""

from __future__ import annotations

import copy
import functools
import re

from gymnasium import spaces

MAX_TEXT_LENGTH = 1 << 20
_OUTSIDE_BMP = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")
_CHARSET = "".join(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)


def fit(text: str) -> str:
    """Make text fit the Text space: basic-plane characters only, at most MAX_TEXT_LENGTH long."""
    if not text.isascii():
        text = _OUTSIDE_BMP.sub("\ufffd", text)
    return text[:MAX_TEXT_LENGTH]


@functools.lru_cache(maxsize=1)
def _text_space_prototype() -> spaces.Text:
    return spaces.Text(max_length=MAX_TEXT_LENGTH, min_length=0, charset=_CHARSET)


def text_space() -> spaces.Text:
    """A Text space over the basic multilingual plane (building one costs ~1 s, so copy a prototype)."""
    space = copy.copy(_text_space_prototype())
    space._np_random = None  # type: ignore[assignment]  # each env seeds its own generator
    return space
