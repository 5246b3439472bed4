#!/usr/bin/env bash
# Issue 12's runs that only an H200 can answer, one device call each (< 9 min). On any other GPU it
# writes OUT/gpu.txt and stops (exit 0), so an H100 that comes costs only its start.
#   PART=kernels (default)
#     pair    trace_moe_one.py shipped against o=1 (pair_order): round r1 at T = 16, M = 8 / 12 / 16,
#             both shapes, timelines kept; rounds r2, r3 at T = 4 / 8 / 16, M = 8 / 16, untraced
#                                                             -> OUT/pair/r{1,2,3}/trace_moe_one.json
#     read    read_floor.py --tiles 48:64:128:128:64 (moe_one's T = 16 tiles)   -> OUT/read/read_floor.json
#     split   run_route_h200.sh PARTS=splitsweep SPLIT_T=1,2,4 (one launch against two below 8 rows)
#                                                             -> OUT/split/sweep_split.json
#   PART=e2e (carry .whl/sglang-0.5.23-moe.tar.gz and .device_carry/sglang-0.5.17-cp312.tar.xz)
#     BASE_ROUTE=auto against fold end to end, ABBA (old new new_2 old_2), B = 8 / 16, budgets 16 / 8,
#     a profiled step at B = 16 budget 16                           -> OUT/e2e/
# Proxy weights and results home (device-slim on base_sglang/models/proxy-moe benchmarks/results).
#   OUT=DIR BASE_COMMIT=sha [PART=kernels|e2e] [PACK=FILE.tgz] bash benchmarks/gpu/run_h200_left_issue12.sh
# PACK: on every exit, DIR is also written as one gzipped tar (the device returns at most 8 files,
# two folders down, and each part writes more), e.g. on the device:
#   OUT=/tmp/k PACK=$OUT/kernels.tgz BASE_COMMIT=sha bash benchmarks/gpu/run_h200_left_issue12.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?OUT is required}
mkdir -p "$OUT"
if [ -n "${PACK:-}" ]; then
    trap 'tar czf "$PACK" -C "$(dirname "$OUT")" "$(basename "$OUT")" || echo "PACK: could not write $PACK" >&2' EXIT
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" | tee "$OUT/gpu.txt"
case "$gpu" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
status=0
case "${PART:-kernels}" in
    kernels)
        ( source benchmarks/gpu_env.sh; kernel_run_env "$OUT/pair"
          mkdir -p "$OUT/pair/r1" "$OUT/pair/r2" "$OUT/pair/r3" "$OUT/read"
          timeout -k 10 ${R1_S:-110} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/pair/r1" \
              --shapes qwen3-30b-a3b,olmoe-1b-7b --tokens 16 --budgets 8,12,16 --variants shipped,o=1 \
              --trace-only shipped,o=1 --budget-s $(( ${R1_S:-110} - 25 )) > "$OUT/pair/r1/trace.log" 2>&1
          grep -vE "^\s*(warn|/)" "$OUT/pair/r1/trace.log" | tail -16 | cut -c1-170
          for r in r2 r3; do
              timeout -k 10 ${RN_S:-75} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/pair/$r" \
                  --shapes qwen3-30b-a3b,olmoe-1b-7b --tokens 4,8,16 --budgets 8,16 --variants shipped,o=1 \
                  --trace-only none --budget-s $(( ${RN_S:-75} - 20 )) > "$OUT/pair/$r/trace.log" 2>&1
              grep -vE "^\s*(warn|/)" "$OUT/pair/$r/trace.log" | tail -14 | cut -c1-170
          done
          timeout -k 10 ${READ_S:-70} python3 benchmarks/gpu/read_floor.py --out "$OUT/read" --budgets 8,16 \
              --tiles 48:64:128:128:64 --grids 2,3 --chunks 16384 --stages 2,4 --warps 4 \
              --budget-s $(( ${READ_S:-70} - 15 )) > "$OUT/read/read.log" 2>&1
          grep -E "best|copy|Error" "$OUT/read/read.log" | cut -c1-200 ) || status=1
        OUT=$OUT/split PARTS=splitsweep SPLIT_T=1,2,4 SPLITSWEEP_S=${SPLIT_S:-150} \
            bash benchmarks/gpu/run_route_h200.sh || status=1 ;;
    e2e)
        E2E_VAR=BASE_ROUTE E2E_VALUES="fold auto auto fold" E2E_NAMES="old new new_2 old_2" E2E_BATCHES="8 16" \
            E2E_BUDGETS="16 8" E2E_PROFILE=16 E2E_PROFILE_BUDGETS=16 DECODE_S=${DECODE_S:-120} \
            DECODE_BUDGET_S=${DECODE_BUDGET_S:-100} OUT=$OUT/e2e bash benchmarks/gpu/run_fold_e2e_h200.sh || status=1 ;;
    *) echo "unknown PART '${PART}' (kernels e2e)" >&2; exit 2 ;;
esac
exit $status
