"""Price lists."""


def price_list(items: dict[str, int]) -> str:
    """One line per item, `name: price` with the price in cents written as euros, cheapest first."""
    lines = [f"{name}: {cents // 100}.{cents % 100:02d} EUR" for name, cents in sorted(items.items())]
    return "\n".join(lines) + "\n"
