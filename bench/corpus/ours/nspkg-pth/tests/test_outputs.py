import subprocess
from pathlib import Path


def test_the_report_was_written():
    assert Path("/app/report.txt").read_text() == "2 shapes: circle, square\n"


def test_the_report_runs_with_the_systems_python():
    subprocess.run(["python3", "/app/report.py"], check=True)
    assert Path("/app/report.txt").read_text() == "2 shapes: circle, square\n"
