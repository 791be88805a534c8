import subprocess
import sys
from pathlib import Path

sys.path.insert(0, "/app/inventory")
from inventory import Ledger  # noqa: E402

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


def test_visible_tests_unchanged_and_pass():
    assert Path("/app/inventory/tests/test_inventory.py").read_text() == VISIBLE_TEST
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        cwd="/app/inventory", capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_ledgers_do_not_share_items():
    a, b = Ledger(), Ledger()
    a.add("x", 2)
    assert b.total() == 0 and b.items == {}


def test_initial_items_still_accepted():
    ledger = Ledger({"pen": 4})
    ledger.remove("pen", 1)
    assert ledger.total() == 3


def test_remove_checks_stock():
    ledger = Ledger()
    ledger.add("mug", 1)
    try:
        ledger.remove("mug", 2)
    except ValueError:
        pass
    else:
        raise AssertionError("removing more than in stock must raise ValueError")
