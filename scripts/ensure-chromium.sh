#!/usr/bin/env bash
# Make sure a headless browser is there for the page tests (tests/test_view.py): Debian's chromium. As root
# on Debian/Ubuntu, install it when missing; otherwise say what to do. Idempotent; prints the browser's path.
set -euo pipefail

find_browser() { command -v chromium || command -v chromium-browser || true; }

browser="$(find_browser)"
if [ -z "$browser" ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "No chromium found. Install it (e.g. 'sudo apt-get install chromium') and rerun." >&2
        exit 1
    fi
    echo "Installing Debian's chromium ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq chromium >/dev/null
    browser="$(find_browser)"
fi
[ -n "$browser" ] || { echo "chromium is still missing after installing it" >&2; exit 1; }
echo "$browser"
