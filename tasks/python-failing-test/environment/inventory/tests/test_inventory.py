from inventory import Ledger


def test_add_and_total():
    ledger = Ledger()
    ledger.add("pen", 3)
    assert ledger.total() == 3


def test_new_ledger_starts_empty():
    first = Ledger()
    first.add("lamp", 1)
    second = Ledger()
    assert second.total() == 0
