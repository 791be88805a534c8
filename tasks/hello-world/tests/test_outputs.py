from pathlib import Path


def test_hello_file_has_exact_content():
    assert Path("/app/hello.txt").read_bytes() == b"Hello, world!\n"
