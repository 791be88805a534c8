from pathlib import Path


def test_bash_users_sorted():
    lines = Path("/app/bash_users.txt").read_text().split("\n")
    if lines[-1] == "":
        lines.pop()
    assert lines == ["alice", "dave", "postgres", "root", "zoe"]
