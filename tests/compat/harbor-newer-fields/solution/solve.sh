#!/bin/bash
# REPORT_PHRASE comes from [solution.env]: without it, the report is wrong.
set -euo pipefail
printf 'phrase=%s\n' "${REPORT_PHRASE:-}" > report.txt  # relative: in the image's WORKDIR
