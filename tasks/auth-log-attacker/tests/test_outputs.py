from pathlib import Path


def test_top_attacker_and_count():
    assert Path("/app/attacker.txt").read_text().split() == ["203.0.113.99", "494"]
