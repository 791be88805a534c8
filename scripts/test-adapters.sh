#!/usr/bin/env bash
# The tests against real ecosystem libraries, each in the library's own virtual environment (.venv-LIB), installed
# from the package's extra of that name: the RL-library adapters (trl, verl, skyrl, verifiers), and Harbor, whose
# validator and viewer read an eval's job folder, and whose own Terminus 2 agent plays beside ours on the same served
# policy (tests/adapters/test_harbor_side_by_side.py; it needs Compose v2, which scripts/ensure-compose.sh installs).
# A library that fails to install or import fails its tests; nothing is skipped.
# Usage: scripts/test-adapters.sh [trl] [verl] [skyrl] [verifiers] [harbor]   (default: all five)
set -uo pipefail
cd "$(dirname "$0")/.."
libs=("$@")
[ ${#libs[@]} -eq 0 ] && libs=(trl verl skyrl verifiers harbor)
stamp_value="$(sha256sum pyproject.toml | cut -c1-16)"

# A Python >= 3.12 for skyrl and harbor: on PATH, else a pyenv build (pyenv's shim refuses versions not selected).
python312() {
    local candidate
    for candidate in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[23]*/bin/python3; do
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    echo "python3.12-not-found"
}
failed=()
for lib in "${libs[@]}"; do
    venv=".venv-$lib"
    case "$lib" in
        skyrl|harbor) python="$(python312)"; preinstall=() ;;  # both need Python >= 3.12
        verifiers) python=python3; preinstall=() ;;     # no torch
        *) python=python3; preinstall=(torch==2.13.0) ;; # the CPU build on disk; a plain torch pulls CUDA
    esac
    if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp_value" ]; then
        echo "== installing $venv ($lib)"
        started=$SECONDS
        rm -rf "$venv"
        if ! { "$python" -m venv "$venv" \
            && "$venv/bin/pip" install -q --upgrade pip \
            && { [ ${#preinstall[@]} -eq 0 ] || "$venv/bin/pip" install -q "${preinstall[@]}"; } \
            && "$venv/bin/pip" install -q -e ".[test,$lib]"; } 2> >(grep -v "^WARNING: Location" >&2); then
            echo "== $lib: install failed" >&2
            failed+=("$lib")
            continue
        fi
        echo "$stamp_value" > "$venv/.installed"
        echo "== $venv installed in $((SECONDS - started)) s"
    fi
    echo "== adapter tests: $lib"
    tests=("tests/adapters/test_$lib.py")
    if [ "$lib" = harbor ]; then
        bash scripts/ensure-compose.sh || { failed+=("$lib"); continue; }
        tests+=(tests/adapters/test_harbor_side_by_side.py)
    fi
    # verifiers runs uv from PATH: the one the extra installed into this environment.
    started=$SECONDS
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/python" -m pytest -q -p no:cacheprovider --adapters \
        "${tests[@]}" || failed+=("$lib")
    echo "== adapter tests: $lib took $((SECONDS - started)) s"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "adapter tests failed for: ${failed[*]}" >&2
    exit 1
fi
