#!/bin/bash
# The report says the phrase and was written by uid 1000 ([agent] user = 1000), and the container has no network
# (network_mode = "no-network"): a connection out fails at once, for want of a route.
mkdir -p /logs/verifier
python3 - <<'PY'
import errno
import os
import socket
from pathlib import Path

problems = []
report = Path("/app/report.txt")
if not report.is_file() or report.read_text() != "phrase=tide-pool\n":
    problems.append(f"report.txt: {report.read_text() if report.is_file() else 'missing'!r}")
elif os.stat(report).st_uid != 1000:
    problems.append(f"report.txt belongs to uid {os.stat(report).st_uid}, not 1000")
try:
    socket.create_connection(("192.0.2.1", 80), timeout=3).close()
    problems.append("a connection out succeeded: the container has a network")
except OSError as exc:
    if exc.errno != errno.ENETUNREACH:
        problems.append(f"a connection out failed with {exc!r}, not for want of a route")
print("\n".join(problems) or "ok")
Path("/logs/verifier/reward.txt").write_text("0\n" if problems else "1\n")
PY
