#!/usr/bin/env bash
# One-command GPU check, for a machine with one NVIDIA GPU (bench/README in docs/notes/routing.md):
#   1. `terminus-env serve` a small model with DP 1;
#   2. the lenient evaluation of two shipped tasks through it (the model is the policy), when Docker answers;
#   3. bench/calibrate_sim.py against it: the simulator settings that match this GPU;
#   4. the routing table (bench/routing_http.py, a small workload) over DP 2 replicas sharing the one GPU.
# It needs vllm, and the routers for step 4 (pip install -e '.[vllm,routers]'), and the model in the local
# Hugging Face cache or reachable. Every phase has a time limit so the whole check ends within 10 minutes;
# results and logs go to $GPU_CHECK_OUT (default ./gpu-check). Usage: bash bench/gpu_check.sh [MODEL]
set -uo pipefail
cd "$(dirname "$0")/.."

MODEL=${1:-Qwen/Qwen2.5-0.5B-Instruct}
OUT_DIR=${GPU_CHECK_OUT:-$PWD/gpu-check}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
PORT1=18000
PORT2=18100
# Three vLLM instances share the GPU at most (DP 1, then DP 2 while DP 1 still evaluates); chunked prefill at
# 8192 tokens so the calibration knows the chunk.
VLLM_ARGS=(--gpu-memory-utilization 0.25 --max-model-len 16384 --max-num-batched-tokens 8192)
mkdir -p "$OUT_DIR"
STARTED=$(date +%s)
declare -A RESULT

log() { echo "[gpu-check $(( $(date +%s) - STARTED ))s] $*" | tee -a "$OUT_DIR/summary.txt"; }

LAUNCHERS=()
cleanup() {
    for pid in "${LAUNCHERS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
    for pid in "${LAUNCHERS[@]}"; do wait "$pid" 2>/dev/null; done
}
trap cleanup EXIT

serve() {  # serve PORT DP VISIBLE_GPUS LOGDIR: start `terminus-env serve` in the background
    local port=$1 dp=$2 gpus=$3 logdir=$4
    CUDA_VISIBLE_DEVICES=$gpus VLLM_SERVER_DEV_MODE=1 "$PY" -m terminus_env.cli serve --model "$MODEL" --dp "$dp" \
        --port "$port" --log-dir "$logdir" --startup-timeout-s 300 -- "${VLLM_ARGS[@]}" > "$logdir.out" 2>&1 &
    LAUNCHERS+=($!)
}

status() {  # status CODE: what the summary says of a step that exited with CODE
    if [ "$1" = 0 ]; then echo ok; else echo "FAILED ($1)"; fi
}

healthy() {  # healthy URL SECONDS: wait for /health
    local url=$1 limit=$2 t=0
    until curl -sf "$url/health" > /dev/null; do
        sleep 2; t=$((t + 2))
        if [ "$t" -ge "$limit" ]; then return 1; fi
    done
    return 0
}

if ! nvidia-smi -L > "$OUT_DIR/gpus.txt" 2>&1; then log "no GPU answers nvidia-smi: nothing to check"; exit 1; fi
if ! "$PY" -c "import vllm, terminus_env" 2> "$OUT_DIR/imports.txt"; then
    log "vllm or terminus_env cannot be imported by $PY (pip install -e '.[vllm,routers]'): $(tail -1 "$OUT_DIR/imports.txt")"
    exit 1
fi
log "$(head -1 "$OUT_DIR/gpus.txt"); model $MODEL; python $PY"

# 1. DP 1.
serve $PORT1 1 0 "$OUT_DIR/serve-dp1"
if healthy "http://127.0.0.1:$PORT1" 240; then RESULT[serve]=ok; else RESULT[serve]=FAILED; fi
log "serve DP 1: ${RESULT[serve]} (see serve-dp1/)"
[ "${RESULT[serve]}" = ok ] || exit 1

# DP 2 on the same GPU starts while the evaluation runs (the launcher gives each replica one entry of
# CUDA_VISIBLE_DEVICES, so "0,0" puts both on GPU 0).
serve $PORT2 2 0,0 "$OUT_DIR/serve-dp2"

# 2. The lenient evaluation through DP 1.
if docker info > /dev/null 2>&1; then
    timeout 150 "$PY" -m terminus_env.cli eval tasks/ --base-url "http://127.0.0.1:$PORT1" --model "$MODEL" \
        --name hello-world --name dotenv-settings --max-turns 6 --max-turn-tokens 1024 --concurrency 2 \
        --run-file "$OUT_DIR/eval.jsonl" > "$OUT_DIR/eval.txt" 2>&1
    code=$?
    RESULT[eval]=$(status "$code")
else
    RESULT[eval]="skipped: no Docker engine answers"
fi
log "eval: ${RESULT[eval]} (eval.txt)"

# 3. Calibration against DP 1, once DP 2 is up and idle (its start-up would disturb the timings).
healthy "http://127.0.0.1:$PORT2" 150 && healthy "http://127.0.0.1:$((PORT2 + 1))" 30
dp2=$?
timeout 150 "$PY" bench/calibrate_sim.py --base-url "http://127.0.0.1:$PORT1" --model "$MODEL" --quick \
    --max-num-batched-tokens 8192 --json "$OUT_DIR/calibration.json" > "$OUT_DIR/calibration.txt" 2>&1
code=$?
RESULT[calibration]=$(status "$code")
log "calibration: ${RESULT[calibration]}; $(grep -h 'SimConfig\|recompute check' "$OUT_DIR/calibration.txt" | tr '\n' ' ')"
kill -TERM "${LAUNCHERS[0]}" 2>/dev/null; wait "${LAUNCHERS[0]}" 2>/dev/null

# 4. The routing table over the DP 2 replicas.
if [ $dp2 = 0 ]; then
    timeout 200 "$PY" bench/routing_http.py --quick --replica-url "http://127.0.0.1:$PORT2" \
        --replica-url "http://127.0.0.1:$((PORT2 + 1))" --model "$MODEL" --logs "$OUT_DIR/routing-logs" \
        --only "ours:" "clairvoyant" "vllm-router cache_aware uncapped" "sglang-router cache_aware uncapped" \
        --json "$OUT_DIR/routing.json" > "$OUT_DIR/routing.txt" 2>&1
    code=$?
    RESULT[routing]=$(status "$code")
else
    RESULT[routing]="FAILED: the DP 2 replicas did not start (serve-dp2/)"
fi
log "routing: ${RESULT[routing]} (routing.txt)"

log "done in $(( $(date +%s) - STARTED )) s: serve ${RESULT[serve]}, eval ${RESULT[eval]}, calibration ${RESULT[calibration]}, routing ${RESULT[routing]}"
[[ "${RESULT[calibration]}" = ok && "${RESULT[routing]}" = ok && "${RESULT[eval]}" != FAILED* ]]
