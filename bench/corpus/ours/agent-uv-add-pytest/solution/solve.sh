#!/bin/bash
set -euo pipefail
source $HOME/.local/bin/env
cd /app
sed -i 's/updated.get(item, 0) + amount + amount/updated.get(item, 0) + amount/' inventory.py
uv init --bare
uv add --dev pytest==8.4.1
PYTHONPATH=/app uv run pytest -q tests
