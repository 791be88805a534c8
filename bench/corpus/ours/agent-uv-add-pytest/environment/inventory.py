"""Stock bookkeeping for a small shop."""


def restock(stock: dict[str, int], item: str, amount: int) -> dict[str, int]:
    """The stock after `amount` more of `item` arrived."""
    updated = dict(stock)
    updated[item] = updated.get(item, 0) + amount + amount
    return updated
