#!/bin/bash
set -euo pipefail
cd /app/src
make
make install
