import json
import os
import urllib.request
from pathlib import Path

SERVICE = "http://tickets:8000"  # the sidecar, by its service name


def get(path):
    with urllib.request.urlopen(SERVICE + path, timeout=5) as response:
        return json.load(response)


def test_exactly_the_open_duplicates_are_closed():
    tickets = {t["id"]: t for t in get("/tickets")}
    closed_now = sorted(i for i, t in tickets.items() if t.get("closed_by_request"))
    assert closed_now == [102, 104, 107]
    assert [i for i, t in sorted(tickets.items()) if t["state"] == "open"] == [101, 103, 106]


def test_closed_ids_are_listed_in_the_working_directory():
    assert Path("/workspace/closed.txt").read_text().split() == ["102", "104", "107"]


def test_the_main_services_compose_settings_hold():
    assert os.environ.get("TICKETS_URL") == "http://tickets:8000"
    assert os.getcwd() == "/workspace"
    shm = os.statvfs("/dev/shm")
    assert shm.f_blocks * shm.f_frsize == 128 << 20
    kinds = {line.split()[1]: line.split()[2] for line in Path("/proc/self/mounts").read_text().splitlines()}
    assert kinds.get("/scratch") == "tmpfs"


def test_the_sidecars_compose_settings_hold():
    settings = get("/settings")
    assert settings["cwd"] == "/srv/data" and settings["tickets_db"] == "/srv/data/tickets.json"
    assert settings["shm_mb"] == 96 and settings["run_tickets"] == "tmpfs"
    assert settings["memory_limit"] == str(256 << 20)
    assert settings["cpu_quota"].split()[0] in ("50000", "50000 100000")
