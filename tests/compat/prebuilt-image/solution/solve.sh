#!/bin/bash
set -euo pipefail
ls -S /opt/data | head -n 1 > /app/largest.txt
