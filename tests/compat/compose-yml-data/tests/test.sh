#!/bin/bash
# The fixed file: the image line closes its variable with a default of 1.4.2; every other line is as it was.
mkdir -p /logs/verifier
python3 - <<'PY'
from pathlib import Path

expected = [
    "services:",
    "  shop:",
    None,  # the image line
    "    environment:",
    "      - SHOP_PORT=8080",
    "    restart: unless-stopped",
]
accepted = {'    image: "registry.local/shop:${SHOP_TAG:-1.4.2}"', '    image: "registry.local/shop:${SHOP_TAG-1.4.2}"'}
try:
    lines = Path("/app/deploy/docker-compose.yml").read_text().splitlines()
except OSError as exc:
    lines = [f"unreadable: {exc}"]
ok = len(lines) == len(expected) and lines[2] in accepted
ok = ok and all(line == want for line, want in zip(lines, expected) if want is not None)
if not ok:
    print("docker-compose.yml is not as expected:", *lines, sep="\n  ")
Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY
