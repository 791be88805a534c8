from pathlib import Path


def test_top_three_server_error_ips():
    lines = [" ".join(line.split()) for line in Path("/app/top_ips.txt").read_text().strip().splitlines()]
    assert lines == ["79 10.0.0.19", "76 10.0.5.150", "74 10.0.0.233"]
