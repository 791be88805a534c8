"""Write rotated sshd auth logs (two plain, two gzipped), deterministically."""
import gzip
import random
import sys
from pathlib import Path

rng = random.Random(42)
out = Path(sys.argv[1])
users = ["root", "admin", "deploy", "alice", "bob"]
ips = [f"203.0.113.{n}" for n in (5, 17, 23, 42, 77, 99)] + [f"198.51.100.{n}" for n in (8, 12, 200)]
weights = {0: [5, 3, 3, 2, 2, 1, 1, 1, 1], 1: [3, 2, 5, 2, 2, 1, 1, 1, 1], 2: [1, 2, 1, 2, 1, 9, 1, 1, 1],
           3: [1, 2, 1, 2, 1, 9, 1, 1, 1]}


def line(day, i):
    return f"Nov {day:2d} {i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d} web1 sshd[{1000 + i}]: "


for index in range(4):
    day = 28 - index * 7
    rows = []
    for i in range(600):
        ip = rng.choices(ips, weights=weights[index])[0]
        user = rng.choice(users)
        kind = rng.random()
        port = rng.randint(30000, 60000)
        if kind < 0.45:
            rows.append(line(day, i) + f"Failed password for {user} from {ip} port {port} ssh2")
        elif kind < 0.75:
            rows.append(line(day, i) + f"Failed password for invalid user {user}x from {ip} port {port} ssh2")
        elif kind < 0.9:
            rows.append(line(day, i) + f"Accepted publickey for {user} from {ip} port {port} ssh2")
        else:
            rows.append(line(day, i) + f"Connection closed by authenticating user {user} {ip} port {port} [preauth]")
    text = "\n".join(rows) + "\n"
    name = "auth.log" if index == 0 else f"auth.log.{index}"
    if index >= 2:
        with gzip.GzipFile(out / f"{name}.gz", "wb", mtime=0) as f:
            f.write(text.encode())
    else:
        (out / name).write_text(text)
