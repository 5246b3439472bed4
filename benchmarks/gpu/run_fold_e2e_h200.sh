#!/usr/bin/env bash
# Issue 12 end to end: SGLang decode (dummy Qwen3-30B-A3B, CUDA graphs, uniform-random routing), one
# plugin setting against another, one run after the other in one call; B = 1, 8 and 16, budgets
# dense, 16 and 4 (at B = 1 only 4 drops anything: top-8 routing). By default the folded router
# (BASE_FOLD=auto: the predictor stacked under each gate, plugin/fold.py) against BASE_FOLD=off;
# run_moe_e2e_h200.sh sets E2E_VAR=BASE_MOE (our fused MoE against SGLang's). E2E_BATCHES and
# E2E_BUDGETS replace the batch sizes and budgets (e.g. E2E_VAR=BASE_MOE_ALIGN E2E_VALUES="auto scan"
# E2E_NAMES="e2e_new e2e_old" E2E_BATCHES="16 32 64" E2E_BUDGETS="dense 16" E2E_PROFILE=64: the sort
# align against the scan, with a profiled step at B = 64 per budget: kernel_tables.py profile OUT).
# A value may add settings after commas (E2E_VAR=BASE_MOE_MAX_ROWS E2E_VALUES="16 64 64,BASE_MOE_ALIGN=scan").
#   -> OUT/<name>/summary.json and OUT/<name>.log per run (E2E_NAMES: e2e_fold e2e_nofold)
#   bash benchmarks/gpu/run_fold_e2e_h200.sh   (repo root; carry .device_carry/*.tar.xz; proxy
#                                               weights stay home: device-slim on)
# bench_decode.py counts load and graph capture inside --time-budget (DECODE_BUDGET_S); a fresh
# machine's first run compiles the Triton kernels during capture (68-78 s on the H200).
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
var=${E2E_VAR:-BASE_FOLD}
read -r -a values <<< "${E2E_VALUES:-${FOLDS:-auto off}}"
read -r -a names <<< "${E2E_NAMES:-e2e_fold e2e_nofold}"
# E2E_PROFILE=B profiles one graph step at batch B (one of E2E_BATCHES) per E2E_PROFILE_BUDGETS
# (default "16 dense") into OUT/<name>/profile_b16.json; unset: no profile
profile=(--profile-batch "${E2E_PROFILE:-0}")
if [ "${E2E_PROFILE:-0}" != 0 ]; then
    read -r -a pbudgets <<< "${E2E_PROFILE_BUDGETS:-16 dense}"
    profile+=(--profile-budgets "${pbudgets[@]}")
fi
for i in "${!values[@]}"; do
    name=${names[$i]}
    IFS=, read -r -a parts <<< "${values[$i]}"
    envs=("$var=${parts[0]}" "${parts[@]:1}")
    log "=== SGLang decode, ${envs[*]} ($name)"
    decode_run "$OUT/$name" "$OUT/$name.log" "${DECODE_S:-230}" "${envs[@]}" -- "${profile[@]}" \
        --batches ${E2E_BATCHES:-1 8 16} --budgets ${E2E_BUDGETS:-dense 16 4} --time-budget "${DECODE_BUDGET_S:-140}" || status=1
    grep -E "folded into|fused MoE|^ ?[0-9]+ |^ B |^--|policy" "$OUT/$name.log" | cut -c1-200 | tail -12 || true
done
exit $status
