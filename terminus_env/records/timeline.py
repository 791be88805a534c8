"""When things happened in a recorded rollout, as wall-clock times.

A trajectory keeps one Unix time (``started_at``) and offsets from it (``ready_s``, each turn's
``replied_s`` and ``observed_s``), so a run file stays small and every format written from it
(ATIF steps, Harbor's result phases, the asciinema cast) agrees on the same instants.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any


def iso(epoch: float) -> str:
    """ISO 8601 in UTC with a ``Z``, as Harbor writes its times."""
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


def epoch(stamp: str) -> float:
    """The Unix time of an ISO 8601 stamp (a ``Z`` or an offset; a naive stamp is taken as UTC)."""
    moment = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def instant(trajectory: Mapping[str, Any], offset_s: float | None) -> float | None:
    """The Unix time ``offset_s`` seconds after the rollout started; None when either is unknown
    (run files written before times were recorded have neither)."""
    started = trajectory.get("started_at")
    if started is None or offset_s is None:
        return None
    return float(started) + float(offset_s)


def iso_at(trajectory: Mapping[str, Any], offset_s: float | None) -> str | None:
    moment = instant(trajectory, offset_s)
    return None if moment is None else iso(moment)
