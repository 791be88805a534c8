"""Where a long eval stands: a tally of rollouts, shown as a progress bar on a terminal.

On a terminal, a tqdm bar on stderr shows done/total, running, failed, errors and the running
mean reward. Elsewhere (CI logs, ``make demo`` piped to a file) a bar would be noise, so each
finished rollout prints one numbered line instead.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO

from tqdm import tqdm


@dataclass
class Tally:
    """Counts, kept apart from their display. ``failed`` is every rollout that earned less than 1."""

    total: int
    done: int = 0
    running: int = 0
    failed: int = 0
    errors: int = 0
    reward_sum: float = 0.0
    scored: int = 0

    @property
    def mean_reward(self) -> float | None:
        """Over the rollouts scored so far (errors are not scored)."""
        return self.reward_sum / self.scored if self.scored else None

    def started(self) -> None:
        self.running += 1

    def finished(self, reward: float, *, error: bool, solved: bool, was_running: bool = True, count: int = 1) -> None:
        """``count`` rollouts ended alike (the trials of a task that could not load count at once)."""
        self.done += count
        self.running -= count if was_running else 0
        self.failed += 0 if solved else count
        self.errors += count if error else 0
        if not error:
            self.reward_sum += reward * count
            self.scored += count

    def describe(self) -> str:
        mean = "-" if self.mean_reward is None else f"{self.mean_reward:.3f}"
        return f"running {self.running} · failed {self.failed} · errors {self.errors} · mean reward {mean}"


class Progress:
    """The display of a :class:`Tally`: a bar on a terminal, numbered lines elsewhere."""

    def __init__(self, tally: Tally, out: TextIO | None = None, bar_stream: TextIO | None = None) -> None:
        """``out`` and ``bar_stream`` default to the standard streams of the moment (not of the import)."""
        bar_stream = sys.stderr if bar_stream is None else bar_stream
        self.tally = tally
        self._out = sys.stdout if out is None else out
        self._bar = tqdm(total=tally.total, initial=tally.done, file=bar_stream, unit="rollout", dynamic_ncols=True,
                         disable=not bar_stream.isatty())  # fmt: skip
        self._refresh()

    def started(self) -> None:
        self.tally.started()
        self._refresh()

    def finished(
        self, label: str, reward: float, *, error: bool, solved: bool, was_running: bool = True, count: int = 1
    ) -> None:
        self.tally.finished(reward, error=error, solved=solved, was_running=was_running, count=count)
        if self._bar.disable:
            width = len(str(self.tally.total))
            print(f"[{self.tally.done:>{width}}/{self.tally.total}] {label}", file=self._out, flush=True)
        else:
            if error:  # errors are worth a line above the bar; everything is in the run file
                self._bar.write(label, file=self._bar.fp)
            self._bar.update(count)
            self._refresh()

    def note(self, text: str) -> None:
        """A line for the user that is no rollout's result (above the bar on a terminal)."""
        if self._bar.disable:
            print(text, file=sys.stderr, flush=True)
        else:
            self._bar.write(text, file=self._bar.fp)

    def close(self) -> None:
        self._bar.close()

    def _refresh(self) -> None:
        if not self._bar.disable:
            self._bar.set_postfix_str(self.tally.describe(), refresh=True)
