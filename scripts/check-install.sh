#!/usr/bin/env bash
# What a user gets from `pip install`: build the sdist and the wheel with `python -m build`, install each into a
# fresh virtual environment outside the checkout, and run the main job from there: `terminus-env --version`,
# `terminus-env tasks list` (the whole shipped suite), `gym.make(..., task="hello-world")` and a short
# `terminus-env eval --sim 2`. Needs Docker and the base image (`make install-check` sees to both).
# Usage: scripts/check-install.sh PYTHON, where PYTHON has the `build` package (the project's .venv does).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
builder="${1:?usage: $0 PYTHON (an interpreter with the build package, e.g. .venv/bin/python)}"
# Tasks through the whole path, from the installed suite; python-failing-test's image copies a folder of .py
# files, next to which pip has written __pycache__.
eval_tasks=(--name hello-world --name python-failing-test)
work="$(mktemp -d "${TMPDIR:-/tmp}/terminus-install-check.XXXXXX")"
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH

fail() { echo "install check: $*" >&2; exit 1; }

echo "== building the sdist and the wheel (python -m build)"
"$builder" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build failed"; }
wheel=("$work"/dist/*.whl)
sdist=("$work"/dist/*.tar.gz)
[[ -f "${wheel[0]}" && -f "${sdist[0]}" ]] || fail "python -m build made no wheel or no sdist"
version="$(basename "${wheel[0]}" | cut -d- -f2)"
expected_tasks="$(find "$repo/tasks" -mindepth 2 -maxdepth 2 -name task.toml | wc -l)"

check_install() {
    local kind="$1" artifact="$2" venv="$work/venv-$1"
    echo "== $kind: installing $(basename "$artifact") into a fresh virtual environment"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$artifact"
    cd "$work"  # nothing of the checkout on the path

    local printed
    printed="$("$venv/bin/terminus-env" --version)"
    [[ "$printed" == "terminus-env $version" ]] || fail "$kind: --version printed '$printed', not 'terminus-env $version'"

    local listing rows
    listing="$("$venv/bin/terminus-env" tasks list)"
    rows="$(tail -n +3 <<<"$listing" | grep -c .)"
    [[ "$rows" == "$expected_tasks" ]] || fail "$kind: tasks list shows $rows tasks, not $expected_tasks:"$'\n'"$listing"
    ! grep -q BROKEN <<<"$listing" || fail "$kind: a shipped task does not load:"$'\n'"$listing"
    echo "tasks list: $rows tasks"

    "$venv/bin/python" - "$venv" <<'PY'
import sys
from pathlib import Path

import gymnasium as gym

import terminus_env

venv = Path(sys.argv[1]).resolve()
assert Path(terminus_env.__file__).resolve().is_relative_to(venv), f"imported from {terminus_env.__file__}"
env = gym.make("terminus_env/Terminus-v0", task="hello-world", mode="eval")
try:
    obs, info = env.reset()
    task = env.unwrapped.task
    assert task.path.resolve().is_relative_to(venv), f"hello-world loaded from {task.path}"
    assert task.instruction.strip() in obs, "the first observation lacks the task's instruction"
    print(f"gym.make: reset hello-world from {task.path}")
finally:
    env.close()
PY

    "$venv/bin/terminus-env" eval --sim 2 --concurrency 2 "${eval_tasks[@]}" || fail "$kind: terminus-env eval --sim 2 failed"
    cd "$repo"
}

check_install wheel "${wheel[0]}"
check_install sdist "${sdist[0]}"
echo "install check: the wheel and the sdist of terminus-env $version both work from a clean environment"
