"""The ticket service: GET /tickets, POST /tickets/<id>/close, GET /health, and GET /settings, which reports
how the container was set up (working directory, environment, /dev/shm, tmpfs, limits) for the tests."""

import http.server
import json
import os
import shutil
import threading
import time

time.sleep(float(os.environ.get("STARTUP_DELAY_S", "0")))  # a slow start: whoever depends on us must wait
DB = os.environ["TICKETS_DB"]
shutil.copy("/opt/tickets/tickets.json", DB)
LOCK = threading.Lock()


def read_first(*paths):
    for path in paths:
        try:
            with open(path) as handle:
                return handle.read().strip()
        except OSError:
            continue
    return None


def settings():
    mounts = {}
    with open("/proc/self/mounts") as handle:
        for line in handle:
            device, point, kind = line.split()[:3]
            mounts[point] = kind
    shm = os.statvfs("/dev/shm")
    return {
        "cwd": os.getcwd(),
        "tickets_db": DB,
        "shm_mb": shm.f_blocks * shm.f_frsize // (1 << 20),
        "run_tickets": mounts.get("/run/tickets"),
        "memory_limit": read_first("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        "cpu_quota": read_first("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
    }


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {"ok": True})
        if self.path == "/settings":
            return self.reply(200, settings())
        if self.path == "/tickets":
            with LOCK, open(DB) as handle:
                return self.reply(200, json.load(handle))
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        parts = self.path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "tickets" or parts[2] != "close" or not parts[1].isdigit():
            return self.reply(404, {"error": "not found"})
        with LOCK:
            with open(DB) as handle:
                tickets = json.load(handle)
            found = [t for t in tickets if t["id"] == int(parts[1])]
            if not found:
                return self.reply(404, {"error": "no such ticket"})
            found[0]["state"] = "closed"
            found[0].setdefault("closed_by_request", True)
            with open(DB, "w") as handle:
                json.dump(tickets, handle)
        self.reply(200, found[0])

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
