#!/bin/bash
set -euo pipefail
python3 -m venv /opt/wordfreq-venv
/opt/wordfreq-venv/bin/pip install /app/wordfreq
ln -sf /opt/wordfreq-venv/bin/wordfreq /usr/local/bin/wordfreq
