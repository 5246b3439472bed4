#!/usr/bin/env bash
# Issue 12 end to end: SGLang decode (dummy Qwen3-30B-A3B, CUDA graphs, uniform-random routing, the
# folded router) with BASE's decode-step MoE calls on our fused_moe (BASE_MOE=auto: plugin/moe.py)
# and on SGLang's Triton MoE (BASE_MOE=sglang), one after the other in one call; B = 1, 8 and 16,
# budgets dense, 16 and 4 (at B = 1 only 4 drops anything: top-8 routing).
#   -> OUT/e2e_ours/summary.json, OUT/e2e_sglang/summary.json, OUT/e2e_*.log
#   bash benchmarks/gpu/run_moe_e2e_h200.sh   (repo root; carry .device_carry/*.tar.xz; proxy
#                                              weights stay home: device-slim on)
#   python benchmarks/kernel_tables.py moe_e2e OUT   (the table)
# The first run of a fresh machine compiles our MoE kernels during graph capture (78 s on the H200,
# sixth session), and bench_decode.py counts load and capture inside --time-budget: keep it >= 200.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-benchmarks/results/kernels_h200_one}
mkdir -p "$OUT"
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT
status=0
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
for moe in ${MOES:-auto sglang}; do
    name=e2e_ours; [ "$moe" = sglang ] && name=e2e_sglang
    log "=== SGLang decode, BASE_MOE=$moe ($name)"
    decode_run "$OUT/$name" "$OUT/$name.log" "${DECODE_S:-260}" BASE_MOE="$moe" -- --profile-batch 0 \
        --batches 1 8 16 --budgets dense 16 4 --time-budget "${DECODE_BUDGET_S:-200}" || status=1
    grep -E "folded into|fused MoE|^ ?[0-9]+ |^ B |^--|policy" "$OUT/$name.log" | cut -c1-200 | tail -12 || true
done
exit $status
