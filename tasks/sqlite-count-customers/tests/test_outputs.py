from pathlib import Path


def test_oslo_count():
    assert Path("/app/answer.txt").read_text().strip() == "14"
