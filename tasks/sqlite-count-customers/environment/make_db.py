"""Build the shop database the SQL tasks query (deterministic: fixed seed)."""
import random
import sqlite3
import sys

rng = random.Random(20261129)
cities = ["Oslo", "Bergen", "Trondheim", "Stavanger", "oslo ", "Tromsø"]
db = sqlite3.connect(sys.argv[1])
db.executescript(
    """
    CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL);
    CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                         placed_on TEXT NOT NULL, status TEXT NOT NULL, amount_cents INTEGER NOT NULL);
    """
)
for cid in range(1, 61):
    db.execute("INSERT INTO customers VALUES (?, ?, ?)", (cid, f"customer-{cid:02d}", rng.choice(cities)))
for oid in range(1, 401):
    status = rng.choice(["paid", "paid", "paid", "cancelled", "refunded"])
    day = f"{rng.choice([2024, 2025, 2025, 2026])}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    db.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?)", (oid, rng.randint(1, 60), day, status, rng.randint(500, 90000)))
db.commit()
