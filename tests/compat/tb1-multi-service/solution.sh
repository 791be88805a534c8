#!/bin/bash
set -euo pipefail
curl -fsS http://inventory:7000/stock | python3 -c '
import json, os, sys
below = int(os.environ["REORDER_BELOW"])
print("\n".join(sorted(sku for sku, count in json.load(sys.stdin).items() if count < below)))
' > reorder.txt  # relative: in the image's WORKDIR, /app
python3 -c 'import json; print(json.dumps(open("reorder.txt").read().split()))' \
  | curl -fsS -X POST -H 'Content-Type: application/json' --data-binary @- http://ledger:7100/reorders >/dev/null
