#!/usr/bin/env bash
# Issue 12 end to end: SGLang decode with BASE's decode-step MoE calls on our fused_moe (BASE_MOE=auto:
# plugin/moe.py) and on SGLang's Triton MoE (BASE_MOE=sglang), folded router, B = 1, 8 and 16,
# budgets dense, 16 and 4: run_fold_e2e_h200.sh with E2E_VAR=BASE_MOE.
#   -> OUT/e2e_ours/summary.json, OUT/e2e_sglang/summary.json, OUT/e2e_*.log
#   bash benchmarks/gpu/run_moe_e2e_h200.sh   (repo root; carry .device_carry/*.tar.xz; proxy
#                                              weights stay home: device-slim on)
#   python benchmarks/kernel_tables.py moe_e2e OUT   (the table)
# The first run of a fresh machine compiles our MoE kernels during graph capture (78 s on the H200,
# sixth session), inside bench_decode.py's --time-budget: hence 200 s.
set -euo pipefail
export OUT=${OUT:-benchmarks/results/kernels_h200_one} E2E_VAR=BASE_MOE E2E_VALUES="auto sglang" \
    E2E_NAMES="e2e_ours e2e_sglang" DECODE_BUDGET_S=${DECODE_BUDGET_S:-200} DECODE_S=${DECODE_S:-260}
exec bash "$(dirname "$0")/run_fold_e2e_h200.sh"
