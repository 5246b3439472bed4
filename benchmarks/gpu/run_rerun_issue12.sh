#!/usr/bin/env bash
# Issue 12's open runs in one device call (< 10 min), chosen by the GPU the call got:
#   H200: the figures the issue names, at HEAD: run_moe_h200.sh PARTS="full check" (the MoE layer
#         with the shipped defaults, SGLang's Triton MoE timed, byte floor; the moe checks), then
#         run_route_h200.sh PARTS=select with that dense layer (selection share, the H200's rule)
#                                                         -> OUT/moe/, OUT/route/
#   H100: the split check with its T = 8 rows (check_kernels_gpu.py --only split), then the rule
#         itself end to end: BASE_ROUTE=auto against fold, ABBA (f1 a1 a2 f2), B = 8 / 16,
#         budgets 16 / 8, a profiled step at B = 16 budget 16     -> OUT/split/, OUT/e2e/
# Carry .whl/sglang-0.5.23-moe.tar.gz and .device_carry/sglang-0.5.17-cp312.tar.xz; proxy weights
# and results home (device-slim on base_sglang/models/proxy-moe benchmarks/results).
#   OUT=DIR BASE_COMMIT=sha bash benchmarks/gpu/run_rerun_issue12.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?OUT is required}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" | tee "$OUT/gpu.txt"
status=0
case "$gpu" in
    *H200*)
        OUT=$OUT/moe PARTS="full check" FULL_S=${FULL_S:-330} bash benchmarks/gpu/run_moe_h200.sh || status=1
        OUT=$OUT/route PARTS=select SHAPES=qwen3-30b-a3b,olmoe-1b-7b TOKENS=1,8,16,32,64 \
            DENSE_FROM=$OUT/moe SELECT_S=${SELECT_S:-240} bash benchmarks/gpu/run_route_h200.sh || status=1 ;;
    *)
        mkdir -p "$OUT/split"  # kernel_run_env creates its DIR only when OUT is unset
        ( source benchmarks/gpu_env.sh; kernel_run_env "$OUT/split"
          timeout -k 10 ${SPLIT_S:-150} python3 benchmarks/check_kernels_gpu.py --only split \
              --shapes qwen3-30b-a3b,olmoe-1b-7b --out "$OUT/split" > "$OUT/split/split.log" 2>&1 ) || status=1
        grep -E "FAIL|checks passed" "$OUT/split/split.log" | cut -c1-200 | tail -8
        E2E_VAR=BASE_ROUTE E2E_VALUES="fold auto auto fold" E2E_NAMES="f1 a1 a2 f2" E2E_BATCHES="8 16" \
            E2E_BUDGETS="16 8" E2E_PROFILE=16 E2E_PROFILE_BUDGETS=16 DECODE_S=${DECODE_S:-160} \
            DECODE_BUDGET_S=${DECODE_BUDGET_S:-120} OUT=$OUT/e2e bash benchmarks/gpu/run_fold_e2e_h200.sh || status=1 ;;
esac
exit $status
