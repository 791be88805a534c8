import sys

sys.path.insert(0, "/app")

from inventory import restock  # noqa: E402


def test_restock_adds_the_amount_once():
    assert restock({"bolt": 2}, "bolt", 3) == {"bolt": 5}


def test_a_new_item_starts_at_zero():
    assert restock({}, "nut", 4) == {"nut": 4}


def test_the_old_stock_is_left_alone():
    stock = {"bolt": 2}
    restock(stock, "bolt", 3)
    assert stock == {"bolt": 2}
