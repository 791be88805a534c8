"""Write a deterministic web-server access log (combined format) for the log task."""
import random
import sys

rng = random.Random(7)
ips = [f"10.0.{rng.randint(0, 9)}.{rng.randint(1, 254)}" for _ in range(40)]
paths = ["/", "/login", "/api/items", "/api/items/42", "/static/app.js", "/health"]
agents = ['"curl/8.4.0"', '"Mozilla/5.0 (X11; Linux x86_64)"', '"kube-probe/1.29"']
with open(sys.argv[1], "w") as log:
    for i in range(3000):
        ip = rng.choice(ips[:6]) if rng.random() < 0.3 else rng.choice(ips)
        status = rng.choices([200, 200, 200, 301, 404, 500, 502, 503], k=1)[0]
        size = rng.choice([0, 512, 1043, 2048, 500, 503, 502])
        ts = f"{1 + i // 200:02d}/Nov/2026:{(i // 60) % 24:02d}:{i % 60:02d}:00 +0000"
        path = rng.choice(paths)
        log.write(f'{ip} - - [{ts}] "GET {path} HTTP/1.1" {status} {size} "-" {rng.choice(agents)}\n')
