import json
import shutil
import subprocess
from pathlib import Path


def test_jq_is_installed_as_a_package():
    assert shutil.which("jq") == "/usr/bin/jq"
    status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "jq"], capture_output=True, text=True)
    assert status.stdout == "install ok installed"


def test_jq_runs():
    result = subprocess.run(["jq", "-c", ".a"], input='{"a": [1, 2]}', capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[1,2]"


def test_port_was_written():
    assert Path("/app/port.txt").read_text().strip() == str(json.loads(Path("/app/config.json").read_text())["port"])
