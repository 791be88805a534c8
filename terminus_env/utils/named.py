"""Named outcomes: enums whose members are plain strings wherever they go (logs, JSON, dict keys)."""

from __future__ import annotations

from enum import Enum


class Named(str, Enum):
    """A ``str`` that prints, formats, compares and serialises as its plain value on every Python version."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    __hash__ = str.__hash__  # so a dict keyed by members equals one keyed by the plain names
