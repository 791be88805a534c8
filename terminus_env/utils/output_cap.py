"""Capping long output the way Terminus does: keep the first and last halves, name what was cut."""

from __future__ import annotations

OUTPUT_LIMIT_BYTES = 10_000


def omission_marker(omitted: int, limit: int) -> str:
    return f"\n[... output limited to {limit} bytes; {omitted} interior bytes omitted ...]\n"


def join_capped(head: str, tail: str, omitted: int, limit: int) -> str:
    """Reassemble a capped text from its kept ends."""
    return head + omission_marker(omitted, limit) + tail if omitted else head + tail


def cap_text(text: str, limit: int = OUTPUT_LIMIT_BYTES) -> tuple[str, int]:
    """(text, omitted bytes): over ``limit`` UTF-8 bytes keeps the first and last ``limit // 2``."""
    if limit < 2:
        raise ValueError(f"an output limit must keep at least one byte at each end, got {limit}")
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text, 0
    half = limit // 2
    omitted = len(data) - 2 * half
    head = data[:half].decode("utf-8", "ignore")
    tail = data[-half:].decode("utf-8", "ignore")
    return join_capped(head, tail, omitted, limit), omitted
