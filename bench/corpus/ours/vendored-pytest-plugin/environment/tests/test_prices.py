from shop.prices import price_list


def test_price_list(golden):
    assert price_list({"hammer": 1250, "bolt": 20, "nut": 5}) == golden("price_list.txt")
