from inventory import restock


def test_restock():
    assert restock({"bolt": 1}, "bolt", 1) == {"bolt": 2}
