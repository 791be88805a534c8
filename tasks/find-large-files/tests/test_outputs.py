from pathlib import Path


def test_large_files_listed():
    lines = Path("/app/large_files.txt").read_text().splitlines()
    assert [line for line in lines if line.strip()] == [
        "/var/data/cache/img/big.bin",
        "/var/data/logs/app.log.1",
        "/var/data/user uploads/holiday video.mp4",
    ]


def test_nothing_removed():
    for path in ["/var/data/cache/img/big.bin", "/var/data/cache/exactly-1MiB.bin", "/var/data/logs/app.log.1"]:
        assert Path(path).is_file()
