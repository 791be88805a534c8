from pathlib import Path


def test_top_three_paid_2025():
    lines = Path("/app/top_customers.csv").read_text().strip().splitlines()
    assert [line.strip() for line in lines] == [
        "name,total",
        "customer-03,3051.40",
        "customer-08,2766.33",
        "customer-55,2702.23",
    ]
