import sys

sys.path.insert(0, "/app")

from shop.prices import price_list  # noqa: E402


def test_cheapest_first():
    assert price_list({"b": 300, "a": 400, "c": 100}) == "c: 1.00 EUR\nb: 3.00 EUR\na: 4.00 EUR\n"
