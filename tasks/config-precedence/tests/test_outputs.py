import configparser
import subprocess

import pytest

EXPECTED = "log_file=/var/log/myapp/prod.log\nmode=production\nworkers=4\n"
CLEAN_ENV = {"HOME": "/root", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM": "dumb"}


@pytest.mark.parametrize("flag", ["-lc", "-ic"])
def test_effective_settings(flag):
    run = subprocess.run(["bash", flag, "myapp show"], env=CLEAN_ENV, capture_output=True, text=True, timeout=30,
                         stdin=subprocess.DEVNULL)
    assert run.stdout == EXPECTED


def test_system_file_is_the_source():
    parser = configparser.ConfigParser()
    assert parser.read("/etc/myapp/config.ini")
    assert dict(parser["app"]) == {"mode": "production", "workers": "4", "log_file": "/var/log/myapp/prod.log"}
