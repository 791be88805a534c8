#!/usr/bin/env bash
# The fresh-machine path, proven: in a clean Debian container, the set-up scripts must install every program the
# set-up runs. A CI machine keeps what an earlier run installed, so a green `make demo` there would hide a missing
# step (as it hid debootstrap once).
#
# The container is the base image: debootstrap's minbase Debian bookworm, which has python3 but none of the
# programs below and no venv module. The check fails if any of them is there at the start (then the container
# would prove nothing), runs the scripts as `make demo` does (the engine's programs installed, not started: no
# engine can start in a plain container), runs them again (they must be idempotent), then requires every program
# and a working `python3 -m venv`.
#
# Usage: scripts/check-fresh-machine.sh [IMAGE]. Needs Docker, the image (`make base-image`) and Debian's mirror.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${1:-terminus-env/base:bookworm}"

# Every program the set-up path runs besides python3 and the shell: the scripts' (docker, dockerd, debootstrap)
# and `terminus-env images base`'s (terminus_env/sandbox/images.py), and zstd, which the grade runs to open Ubuntu's
# package archives (sandbox/package_proof.py; gpgv, which it runs too, comes with apt, so even minbase has it).
# tests/test_fresh_machine.py keeps this list in step with what images.py runs.
tools=(debootstrap docker dockerd tar umount zstd)

echo "== fresh machine: the set-up scripts in a clean container of $image"
started=$SECONDS
docker run --rm --label terminus-env.fresh-machine-check=1 -v "$repo/scripts:/setup:ro" \
    -e TOOLS="${tools[*]}" "$image" bash -c '
set -euo pipefail
fail() { echo "fresh machine: $*" >&2; exit 1; }
present=()
for tool in $TOOLS; do command -v "$tool" >/dev/null 2>&1 && present+=("$tool"); done
# tar and umount come with every Debian; the others must be missing, or this container is no fresh machine.
for tool in debootstrap docker dockerd; do
    [[ " ${present[*]} " != *" $tool "* ]] || fail "$tool is already installed: this container is not a fresh machine"
done
python3 -m venv /tmp/before >/dev/null 2>&1 && fail "python3 -m venv already works: this container is not a fresh machine"
echo "at the start: ${present[*]:-none of them} of: $TOOLS; python3 -m venv fails"

for round in 1 2; do
    bash /setup/ensure-python.sh
    bash /setup/ensure-debootstrap.sh
    bash /setup/ensure-docker.sh --install-only
    echo "set-up scripts: round $round done"
done

for tool in $TOOLS; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is missing after the set-up scripts: install it from one of them"
done
python3 -m venv /tmp/after || fail "python3 -m venv fails after scripts/ensure-python.sh"
debootstrap --version >/dev/null && dockerd --version >/dev/null && docker --version >/dev/null
echo "after the scripts: every program is installed ($TOOLS) and python3 -m venv works"
'
echo "fresh machine: ok in $((SECONDS - started)) s"
