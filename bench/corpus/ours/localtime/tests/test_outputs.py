import os
import subprocess
import time
from pathlib import Path


def test_etc_timezone_names_new_york():
    assert Path("/etc/timezone").read_text().strip() == "America/New_York"


def test_etc_localtime_is_new_york():
    assert os.path.realpath("/etc/localtime") == "/usr/share/zoneinfo/America/New_York"


def test_a_program_started_now_uses_new_york_time():
    assert time.tzname in (("EST", "EDT"), ("EDT", "EST"))
    assert subprocess.run(["date", "+%Z"], capture_output=True, text=True, check=True).stdout.strip() in ("EST", "EDT")
