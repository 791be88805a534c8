"""A client of the warehouse's stock service."""

import httpx


def total_stock(client: httpx.Client) -> int:
    """How many pieces the warehouse holds, all items together."""
    response = client.get("/stock")
    response.raise_for_status()
    return len(response.json()["items"])
