#!/bin/bash
set -euo pipefail
curl -fsS http://inventory.internal:8080/items \
  | python3 -c 'import json, sys; print(sum(1 for item in json.load(sys.stdin) if item["stock"] == 0))' \
  > /app/out_of_stock.txt
curl -fsS -X PUT --data-binary 4.2 http://inventory.internal:8080/kv/release
