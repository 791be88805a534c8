#!/usr/bin/env bash
# Make sure debootstrap is installed: with no registry reachable, the base image is built with it.
# As root on Debian/Ubuntu, install it when missing; otherwise say what to do. Idempotent.
set -euo pipefail

command -v debootstrap >/dev/null 2>&1 && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "debootstrap is missing: install it (e.g. 'sudo apt-get install debootstrap') and rerun." >&2
    exit 1
fi
echo "Installing Debian's debootstrap ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq debootstrap >/dev/null
