import sys

import httpx

sys.path.insert(0, "/app")

from stock_client import total_stock  # noqa: E402

ITEMS = [{"name": "bolt", "count": 3}, {"name": "nut", "count": 4}, {"name": "washer", "count": 10}]


def client(items):
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/stock"
        return httpx.Response(200, json={"items": items})

    return httpx.Client(transport=httpx.MockTransport(answer), base_url="http://stock")


def test_total_sums_the_counts():
    assert total_stock(client(ITEMS)) == 17


def test_an_empty_warehouse_holds_nothing():
    assert total_stock(client([])) == 0
