from calc.stats import mean


def test_mean_of_three():
    assert mean([1.0, 2.0, 6.0]) == 3.0
