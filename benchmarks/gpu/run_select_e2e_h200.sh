#!/usr/bin/env bash
# Issue 12 end to end: SGLang decode (dummy Qwen3-30B-A3B, CUDA graphs, uniform-random routing) at
# B=16 with the plugin's default selection kernel (base_fused_select at this shape), then with the
# previous pair of launches (BASE_SELECT_KERNEL=two), one after the other in one call (~6 min;
# the first run compiles every Triton kernel during its graph capture, ~75 s).
#   -> OUT/e2e_fused/summary.json, OUT/e2e_two/summary.json, OUT/e2e_*.log
# KERNELS="two fused two" repeats a kernel (later runs write OUT/e2e_<kernel>_<n>/) to see the
# drift between sequential runs; PROFILE=1 adds bench_decode's B=16 kernel profile to each run.
#   bash benchmarks/gpu/run_select_e2e_h200.sh   (repo root; carry .device_carry/*.tar.xz; proxy
#                                                 weights stay home: device-slim on)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-benchmarks/results/kernels_h200_fused}
mkdir -p "$OUT"
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT
status=0
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
declare -A seen=()
for kernel in ${KERNELS:-fused two}; do
    n=$(( ${seen[$kernel]:-0} + 1 )); seen[$kernel]=$n
    name=e2e_$kernel; [ "$n" -gt 1 ] && name=${name}_$n
    log "=== SGLang decode, selection kernel: $kernel ($name)"
    if [ "$kernel" = fused ]; then sel=(-u BASE_SELECT_KERNEL); else sel=(BASE_SELECT_KERNEL=two); fi
    decode_run "$OUT/$name" "$OUT/$name.log" "${DECODE_S:-240}" "${sel[@]}" -- \
        --profile-batch "$([ "${PROFILE:-0}" = 1 ] && echo 16 || echo 0)" --batches 16 \
        --budgets dense 128 16 10 --time-budget "${DECODE_BUDGET_S:-150}" || status=1
    grep -E "^ ?[0-9]+ |^ B |^--|policy" "$OUT/$name.log" | tail -8 || true
done
exit $status
