#!/bin/bash
set -euo pipefail
pip install -r /app/requirements.txt
python3 /app/report.py
