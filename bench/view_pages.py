"""The job page at scale: its size, and how fast a headless Chromium loads it, filters it and sorts it.

Usage: .venv/bin/python bench/view_pages.py [--trials 50 500 2000] [--loads 7] [--json FILE]

For each size, a synthetic eval of that many trials (5 per task, one task that did not load; written by the eval's
own writers, tests/view_support.py) gets its pages from ``terminus-env view``. Figures per size: the time to write
every page, the job page's size and its JSON's, the trial pages' total; then, in one Chromium, the job page's load
time by the browser's own Navigation Timing (``loadEventEnd``, the median of ``--loads`` fresh loads), and the time
its script takes to filter the table by an end reason and to sort it by mean reward. The smallest size is the
baseline of the others, measured in the same run; one trial's page is loaded beside them. The machine's load
average is printed before and after: other work on the cores slows every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the browser driver and the synthetic eval the tests use

from browser_support import Browser, chromium_path  # noqa: E402
from view_support import write_synthetic_job  # noqa: E402

from terminus_env.cli import main as cli_main  # noqa: E402

TRIALS_PER_TASK = 5
LOAD_TIME = "(e => e.loadEventEnd - e.startTime)(performance.getEntriesByType('navigation')[0])"
FILTER_TIME = """(() => {
  const reason = document.getElementById("filter-reason"), started = performance.now();
  reason.value = "format_error";
  reason.dispatchEvent(new Event("input", {bubbles: true}));
  const took = performance.now() - started;
  reason.value = "";
  reason.dispatchEvent(new Event("input", {bubbles: true}));
  return took;
})()"""
SORT_TIME = """(() => {
  const header = document.querySelectorAll("#tasks thead th")[2], started = performance.now();
  header.click();
  return performance.now() - started;
})()"""


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(browser: Browser, page: Path, loads: int) -> dict[str, float]:
    """The median load time of ``page`` (each load a fresh navigation), and its filter and sort times."""
    times = []
    for _ in range(loads):
        browser.open(page)
        times.append(browser.evaluate(LOAD_TIME))
    figures = {"load_ms": statistics.median(times), "load_ms_min": min(times), "load_ms_max": max(times)}
    if browser.evaluate("document.getElementById('tasks') !== null"):
        figures["filter_ms"] = statistics.median(browser.evaluate(FILTER_TIME) for _ in range(loads))
        figures["sort_ms"] = statistics.median(browser.evaluate(SORT_TIME) for _ in range(loads))
    return figures


def describe(row: dict[str, float]) -> str:
    r = row
    return (f"{r['trials']:>5} trials: pages written in {r['write_s']:.1f} s; job page {r['page_kb']:.0f} KB (JSON "
            f"{r['json_kb']:.0f} KB, trial pages {r['trial_pages_mb']:.1f} MB); loads in {r['load_ms']:.0f} ms (min "
            f"{r['load_ms_min']:.0f}, max {r['load_ms_max']:.0f}); filter {r['filter_ms']:.1f} ms, sort "
            f"{r['sort_ms']:.1f} ms; load average {r['load_average']:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, nargs="+", default=[50, 500], help="job sizes, in trials")
    parser.add_argument("--loads", type=int, default=7, help="fresh loads of each page (the median is reported)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    print(f"{os.cpu_count()} CPUs; load average {load()} at the start")
    rows = []
    with tempfile.TemporaryDirectory(prefix="view-bench-") as scratch, Browser(chromium_path()) as browser:
        for trials in sorted(args.trials):
            root = Path(scratch) / f"job-{trials}"
            made = write_synthetic_job(root, tasks=max(trials // TRIALS_PER_TASK, 2), trials=TRIALS_PER_TASK)
            started = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # the command's own lines: where it wrote the pages
                assert cli_main(["view", str(made.job)]) == 0
            written_s = time.perf_counter() - started
            page = made.job / "job.html"
            trial_pages = list(made.job.glob("*/trajectory.html"))
            row = {
                "trials": len(trial_pages),
                "write_s": written_s,
                "page_kb": page.stat().st_size / 1024,
                "json_kb": (made.job / "job.summary.json").stat().st_size / 1024,
                "trial_pages_mb": sum(p.stat().st_size for p in trial_pages) / 2**20,
                **measure(browser, page, args.loads),
                "load_average": os.getloadavg()[0],
            }
            rows.append(row)
            print(describe(row), flush=True)
        one = measure(browser, trial_pages[0], args.loads)
        print(f"one trial's page: loads in {one['load_ms']:.0f} ms (min {one['load_ms_min']:.0f}, max "
              f"{one['load_ms_max']:.0f})")  # fmt: skip
    print(f"load average {load()} at the end")
    if args.json:
        args.json.write_text(json.dumps({"sizes": rows, "trial_page": one, "cpus": os.cpu_count()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
