#!/bin/bash
cd /app/inventory
python3 - <<'PY'
from pathlib import Path
path = Path("inventory.py")
text = path.read_text()
text = text.replace(
    "    def __init__(self, items={}):\n        self.items = items\n",
    "    def __init__(self, items=None):\n        self.items = dict(items) if items else {}\n",
)
path.write_text(text)
PY
python3 -m pytest -q
