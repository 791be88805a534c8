#!/bin/bash
set -euo pipefail
curl -fsS http://inventory.internal:8080/items \
  | python3 -c 'import json, sys; print(sum(1 for item in json.load(sys.stdin) if item["stock"] == 0))' \
  > out_of_stock.txt  # relative: the episode starts in the image's WORKDIR, as in Harbor
curl -fsS -X PUT --data-binary 4.2 http://inventory.internal:8080/kv/release
