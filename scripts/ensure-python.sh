#!/usr/bin/env bash
# Make sure python3 (3.10+) can create virtual environments, and that gpgv and zstd are there (the grade checks
# Debian's signed package indices with gpgv and opens Ubuntu's zstd archives with zstd, sandbox/package_proof.py);
# on Debian/Ubuntu as root, install what is missing.
set -euo pipefail

need=()
command -v gpgv >/dev/null 2>&1 || need+=(gpgv)
command -v zstd >/dev/null 2>&1 || need+=(zstd)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
        echo "terminus-env needs Python 3.10 or newer; found $(python3 --version)." >&2
        exit 1
    }
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "Missing: ${need[*]}. Install them (e.g. 'sudo apt-get install ${need[*]}') and rerun." >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
