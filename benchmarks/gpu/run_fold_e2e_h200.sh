#!/usr/bin/env bash
# Issue 12 end to end: SGLang decode (dummy Qwen3-30B-A3B, CUDA graphs, uniform-random routing) with
# the plugin's folded router (BASE_FOLD=auto: the predictor stacked under each gate, plugin/fold.py)
# and without it (BASE_FOLD=off), one after the other in one call; B = 1, 8 and 16, budgets dense,
# 16 and 4 (at B = 1 only 4 drops anything: top-8 routing).
#   -> OUT/e2e_fold/summary.json, OUT/e2e_nofold/summary.json, OUT/e2e_*.log
#   bash benchmarks/gpu/run_fold_e2e_h200.sh   (repo root; carry .device_carry/*.tar.xz; proxy
#                                               weights stay home: device-slim on)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-benchmarks/results/kernels_h200_route}
mkdir -p "$OUT"
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT
status=0
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
for fold in ${FOLDS:-auto off}; do
    name=e2e_fold; [ "$fold" = off ] && name=e2e_nofold
    log "=== SGLang decode, BASE_FOLD=$fold ($name)"
    decode_run "$OUT/$name" "$OUT/$name.log" "${DECODE_S:-230}" BASE_FOLD="$fold" -- --profile-batch 0 \
        --batches 1 8 16 --budgets dense 16 4 --time-budget "${DECODE_BUDGET_S:-140}" || status=1
    grep -E "folded into|^ ?[0-9]+ |^ B |^--|policy" "$OUT/$name.log" | cut -c1-200 | tail -12 || true
done
exit $status
