"""The checks run the agent's code in a subprocess and compare what it prints: imported into pytest's own process,
the module could end the run with success, or turn these tests into no-ops, before any assertion ran."""

import subprocess
import sys
from pathlib import Path

PROJECT = "/app/inventory"
VISIBLE_TEST = '''from inventory import Ledger


def test_add_and_total():
    ledger = Ledger()
    ledger.add("pen", 3)
    assert ledger.total() == 3


def test_new_ledger_starts_empty():
    first = Ledger()
    first.add("lamp", 1)
    second = Ledger()
    assert second.total() == 0
'''


def ledger(code: str) -> str:
    """What ``code`` prints, run with ``Ledger`` imported from the project, in a Python of its own."""
    run = subprocess.run(
        [sys.executable, "-c", f"from inventory import Ledger\n{code}"],
        cwd=PROJECT, capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout.strip()


def test_visible_tests_unchanged_and_pass():
    assert Path(f"{PROJECT}/tests/test_inventory.py").read_text() == VISIBLE_TEST
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", "/dev/null", "--noconftest",
         "--rootdir", PROJECT, "-q", "tests"],
        cwd=PROJECT, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout + run.stderr


def test_ledgers_do_not_share_items():
    assert ledger("a, b = Ledger(), Ledger()\na.add('x', 2)\nprint(b.total(), b.items)") == "0 {}"


def test_initial_items_still_accepted():
    assert ledger("ledger = Ledger({'pen': 4})\nledger.remove('pen', 1)\nprint(ledger.total())") == "3"


def test_remove_checks_stock():
    code = (
        "ledger = Ledger()\nledger.add('mug', 1)\n"
        "try:\n    ledger.remove('mug', 2)\nexcept ValueError:\n    print('refused')\nelse:\n    print('removed')"
    )
    assert ledger(code) == "refused"
