#!/bin/bash
set -euo pipefail
sed -i 's/updated.get(item, 0) + amount + amount/updated.get(item, 0) + amount/' /app/inventory.py
