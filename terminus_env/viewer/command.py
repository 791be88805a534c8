"""``terminus-env view RUN``: write the page of one trial and say where it is."""

from __future__ import annotations

import argparse
from pathlib import Path

from terminus_env.viewer.page import render
from terminus_env.viewer.source import ViewError, find_trial

PAGE = "trajectory.html"


def main(args: argparse.Namespace) -> int:
    run = Path(args.run)
    found = find_trial(run, args.trial)
    output = Path(args.output) if args.output else default_output(run, found.trial.name)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(render(found.trial), encoding="utf-8")
    except OSError as exc:
        raise ViewError(f"cannot write {output} ({exc}); pass --output PAGE.html somewhere writable") from exc
    print(output)
    others = [name for name in found.names if name != found.trial.name]
    if others and args.trial is None:
        print(f"{found.trial.name} is one of {len(found.names)} trials in {run}; pass --trial NAME for another "
              f"({', '.join(others[:5])}{', …' if len(others) > 5 else ''})")  # fmt: skip
    return 0


def default_output(run: Path, trial: str) -> Path:
    """Beside what was given: in the trial's folder, or next to the run file."""
    if run.is_file():
        return run.with_name(f"{run.stem}.{trial}.html")
    if run.name == trial:
        return run / PAGE
    return run / trial / PAGE
