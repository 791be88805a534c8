#!/bin/bash
set -euo pipefail
ls -S /opt/data | head -n 1 > largest.txt  # relative: in the image's WORKDIR
