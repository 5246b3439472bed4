#!/usr/bin/env bash
# Issue 12, thirty-first session, one device call (< 6 min): moe_one pair_order (the programs alone on
# their SM walk the first units; kernels/moe_one.py) against the shipped rows and idle_low, and the
# tile-pattern read floor.
#   t16     trace_moe_one.py, Qwen3 + OLMoE T = 16, M = 8 / 12 / 16: shipped, o=1, i=1, o=1/dn=64:128,
#           dn=64:128 (shipped and o=1 traced)                  -> OUT/t16/trace_moe_one.json
#   t48     the same at T = 4 / 8, M = 8 / 16: shipped, o=1       -> OUT/t48/trace_moe_one.json
#   read    read_floor.py --tiles 48:64:128:128:64 (moe_one's T = 16 tiles) -> OUT/read/read_floor.json
# Nothing to carry; proxy weights and results home (device-slim on base_sglang/models/proxy-moe
# benchmarks/results).   OUT=DIR bash benchmarks/gpu/run_pair_issue12.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?OUT is required}
mkdir -p "$OUT/t16" "$OUT/t48" "$OUT/read"
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee "$OUT/gpu.txt"
source benchmarks/gpu_env.sh
kernel_run_env "$OUT"
status=0
timeout -k 10 ${T16_S:-190} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/t16" \
    --shapes qwen3-30b-a3b,olmoe-1b-7b --tokens 16 --budgets 8,12,16 \
    --variants shipped,o=1,i=1,o=1/dn=64:128,dn=64:128 --trace-only shipped,o=1 \
    --budget-s $(( ${T16_S:-190} - 30 )) > "$OUT/t16/trace.log" 2>&1 || status=1
grep -vE "^\s*(warn|/)" "$OUT/t16/trace.log" | tail -34 | cut -c1-170
timeout -k 10 ${T48_S:-80} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/t48" \
    --shapes qwen3-30b-a3b --tokens 4,8 --budgets 8,16 --variants shipped,o=1 --trace-only none \
    --budget-s $(( ${T48_S:-80} - 25 )) > "$OUT/t48/trace.log" 2>&1 || status=1
grep -vE "^\s*(warn|/)" "$OUT/t48/trace.log" | tail -12 | cut -c1-170
timeout -k 10 ${READ_S:-70} python3 benchmarks/gpu/read_floor.py --out "$OUT/read" --budgets 8,16 \
    --tiles 48:64:128:128:64 --grids 2,3 --chunks 16384 --stages 2,4 --warps 4 \
    --budget-s $(( ${READ_S:-70} - 15 )) > "$OUT/read/read.log" 2>&1 || status=1
grep -E "best|copy|Error" "$OUT/read/read.log" | cut -c1-200
exit $status
