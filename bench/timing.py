"""Timing helpers the benchmarks share."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


async def timed(action: Callable[[], Awaitable[object]], repeat: int) -> list[float]:
    """Wall seconds of each of ``repeat`` awaited calls of ``action``, one after another."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await action()
        times.append(time.perf_counter() - started)
    return times


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
