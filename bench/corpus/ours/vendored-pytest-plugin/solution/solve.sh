#!/bin/bash
set -euo pipefail
cd /app
pip install ./vendor/pytest-golden
sed -i 's/for name, cents in sorted(items.items())\]/for name, cents in sorted(items.items(), key=lambda item: item[1])]/' \
    shop/prices.py
python3 -m pytest -q tests
