from pathlib import Path


def test_shipped_ids_in_file_order():
    assert Path("/app/shipped.txt").read_text().split() == ["A-1001", "A-1004", "A-1006"]
