#!/usr/bin/env bash
# The server path on the GPU, dummy Qwen3-30B-A3B: base-serve --backend sglang, then SGLang's own
# launch_server with the plugin. For each: the openai-client checks (server_client.py), then
# sglang.bench_serving --backend sglang-oai over concurrencies x budgets (serving_sweep.py).
#   bash benchmarks/gpu/check_server_sglang.sh [OUT]      (run from anywhere; ~8 min on an H200)
# Knobs (environment): SERVE_CONC="16 32 64" and SGL_CONC="32" (bench_serving concurrencies against
# base-serve and launch_server), BUDGETS="dense 16 10", SERVER_START_S=300, SWEEP_S=150 (per server),
# SKIP_LAUNCH_SERVER=1 (base-serve only). Writes OUT/server_checks.json, OUT/bench_serving.jsonl,
# OUT/serving_summary.json, OUT/base_serve.log, OUT/launch_server.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there
OUT=${1:-${OUT:-benchmarks/results/sglang_h200}}
mkdir -p "$OUT"
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT

SERVE_CONC=${SERVE_CONC:-16 32 64}
SGL_CONC=${SGL_CONC:-32}
BUDGETS=${BUDGETS:-dense 16 10}
SERVER_START_S=${SERVER_START_S:-300}
SWEEP_S=${SWEEP_S:-150}
MODEL_DIR=/tmp/base-bench/qwen3-30b-a3b
PRED=/tmp/base-bench/predictor-qwen3-30b-a3b.safetensors
NAME=qwen3-30b-a3b-dummy
MAXBS=64
# the same SGLang settings for both servers: dummy weights, Triton attention + MoE, decode graphs
# only for the batch sizes a concurrency <= 64 run reaches
SGL_ARGS=(--load-format dummy --attention-backend triton --sampling-backend pytorch
          --grammar-backend none --moe-runner-backend triton --mem-fraction-static 0.7
          --cuda-graph-bs-decode 1 2 4 8 16 32 48 64 --cuda-graph-max-bs-decode $MAXBS
          --cuda-graph-backend-prefill disabled)

sgl_setup
project_check
with_sgl python3 benchmarks/gpu/common.py prepare --model-dir "$MODEL_DIR" --predictor "$PRED"
rm -f "$OUT/server_checks.json" "$OUT/bench_serving.jsonl"
status=0

run_server() {  # run_server FLAVOR PORT LOG CONCURRENCIES CMD...
    local flavor=$1 port=$2 logf=$3 conc=$4; shift 4
    local t0=$SECONDS
    log "starting $flavor: $*"
    start_group "$logf" bash benchmarks/gpu/sgl_exec.sh "$@"
    local pg=$LAST_GROUP
    if ! wait_http "http://127.0.0.1:$port/health" "$SERVER_START_S" "$pg"; then
        tail -30 "$logf"
        stop_group "$pg"
        status=1
        return 0
    fi
    log "$flavor up in $((SECONDS - t0)) s"
    with_sgl python3 benchmarks/gpu/server_client.py --base-url "http://127.0.0.1:$port" \
        --flavor "$flavor" --model $NAME --out "$OUT/server_checks.json" || status=1
    # shellcheck disable=SC2086
    with_sgl timeout -k 10 $((SWEEP_S + 60)) python3 benchmarks/gpu/serving_sweep.py \
        --base-url "http://127.0.0.1:$port" --flavor "$flavor" --model $NAME \
        --tokenizer "$MODEL_DIR" --out "$OUT" --concurrency $conc --budgets $BUDGETS \
        --time-budget "$SWEEP_S" || status=1
    stop_group "$pg"
    log "$flavor done in $((SECONDS - t0)) s"
}

# 1. base-serve --backend sglang (SGLang Engine in-process, BASE through the plugin)
run_server base-serve 8000 "$OUT/base_serve.log" "$SERVE_CONC" \
    env BASE_STATS_INTERVAL=200 python3 -m base_sglang.server --backend sglang \
    --model "$MODEL_DIR" --predictor "$PRED" --port 8000 --max-running-requests $MAXBS \
    --served-model-name $NAME "${SGL_ARGS[@]}"

# 2. SGLang's own server with the plugin (budgets via custom_params / the header)
if [ "${SKIP_LAUNCH_SERVER:-0}" != 1 ]; then
    run_server sglang 30000 "$OUT/launch_server.log" "$SGL_CONC" \
        env BASE_PREDICTOR="$PRED" BASE_DEFAULT_BUDGET=dense BASE_STATS_INTERVAL=200 \
        python3 -m sglang.launch_server --model-path "$MODEL_DIR" --port 30000 \
        --max-running-requests $MAXBS --served-model-name $NAME "${SGL_ARGS[@]}"
fi

with_sgl python3 benchmarks/gpu/serving_sweep.py --summary --out "$OUT" || true
python3 - "$OUT/server_checks.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for flavor, r in d.items():
    bad = [c["name"] for c in r["checks"] if not c["ok"]]
    print(f"{flavor}: {r['passed']}/{r['total']} openai-client checks passed" + (f"; failed {bad}" if bad else ""))
PY
exit $status
