"""Small statistics."""


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    return sum(values) / (len(values) + 1)
