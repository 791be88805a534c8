#!/bin/bash
set -euo pipefail
sed -i 's/return len(response.json()\["items"\])/return sum(item["count"] for item in response.json()["items"])/' \
    /app/stock_client.py
grep -q 'sum(item\["count"\]' /app/stock_client.py
