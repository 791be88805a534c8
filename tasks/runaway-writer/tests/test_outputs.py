import subprocess
import time
from pathlib import Path


def cmdlines():
    lines = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                lines.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return lines


def metrics_processes():
    return [c for c in cmdlines() if "/usr/lib/metrics/" in c]


def spool_size():
    path = Path("/var/log/metrics/spool.log")
    return path.stat().st_size if path.exists() else 0


def test_keepalive_still_running():
    # first: the login shell started below would bring a killed keep-alive back
    assert any("/usr/local/bin/db-keepalive" in c for c in cmdlines())


def test_culprit_named():
    assert Path("/app/culprit.txt").read_text().strip() == "/usr/lib/metrics/watchdog.sh"


def test_writer_stopped_and_stays_stopped():
    assert metrics_processes() == []
    before = spool_size()
    time.sleep(2.5)
    assert metrics_processes() == []
    assert spool_size() == before


def test_new_login_shell_does_not_restart_it():
    subprocess.run(["bash", "-lc", "true"], timeout=30, check=False)
    time.sleep(2.5)
    assert metrics_processes() == []
