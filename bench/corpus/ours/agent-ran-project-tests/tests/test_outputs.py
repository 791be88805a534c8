import sys

sys.path.insert(0, "/app")

from calc.stats import mean  # noqa: E402


def test_mean_of_one():
    assert mean([4.5]) == 4.5


def test_mean_of_negatives():
    assert mean([-2.0, -4.0]) == -3.0
