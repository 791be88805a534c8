#!/bin/bash
sqlite3 -csv -header /data/shop.db > /app/top_customers.csv <<'SQL'
SELECT c.name AS name, printf('%.2f', SUM(o.amount_cents) / 100.0) AS total
FROM orders o JOIN customers c ON c.id = o.customer_id
WHERE o.status = 'paid' AND o.placed_on BETWEEN '2025-01-01' AND '2025-12-31'
GROUP BY c.id
ORDER BY SUM(o.amount_cents) DESC
LIMIT 3;
SQL
