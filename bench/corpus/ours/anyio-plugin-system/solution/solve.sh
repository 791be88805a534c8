#!/bin/bash
set -euo pipefail
pip install -r /app/requirements.txt
sed -i 's/return len(response.json()\["items"\])/return sum(item["count"] for item in response.json()["items"])/' \
    /app/stock_client.py
grep -q 'sum(item\["count"\]' /app/stock_client.py
