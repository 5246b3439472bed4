#!/usr/bin/env bash
# Issue 12's byte floor at small budgets, one device call (< 10 min), thirtieth session:
#   trace   trace_moe_one.py at Qwen3 T = 8 / 16 / 32, M = 8..16: the shipped rows (tuned at M = 16)
#           against narrower down tiles and up units, the tilings a launch with few experts may want
#                                                         -> OUT/trace/trace_moe_one.json
#   read    read_floor.py: the same kept experts' bytes streamed by one launch with no compute
#           (how close any single launch gets to the copy-rate floor)   -> OUT/read/read_floor.json
#   ncu     Nsight Compute on one launch each: moe_one shipped and dn=64:64 at M = 8 / 16, and the
#           read stream                                   -> OUT/ncu/ncu_details.txt
#   split   H200 only: the route-select split sweep at T = 1, 2, 4 (rows below 8, unmeasured there)
#                                                         -> OUT/splitsweep/
# Knobs (thirty-first session): VARIANTS, TRACE_BUDGETS, TRACE_ONLY, TRACE832= (empty: skip T = 8 / 32),
# READ_ARGS (e.g. "--tiles 48:64:128:128:64 --grids 2,3 --chunks 16384 --stages 2,4 --warps 4").
# Nothing to carry; proxy weights and results home (device-slim on base_sglang/models/proxy-moe
# benchmarks/results).   OUT=DIR BASE_COMMIT=sha [PARTS="trace read ncu split"] bash benchmarks/gpu/run_floor_issue12.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:?OUT is required}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "gpu: $gpu" | tee "$OUT/gpu.txt"
source benchmarks/gpu_env.sh
kernel_run_env "$OUT"
status=0
VARIANTS=${VARIANTS:-shipped,dn=64:64,dn=64:128,u=32,u=32/dn=64:64,u=32/dn=64:128,c=4/u=32/dn=64:64}
for part in ${PARTS:-trace read ncu split}; do
    case "$part" in
        trace) mkdir -p "$OUT/trace"
            echo "=== trace: Qwen3 T = 16, M = 8 10 12 16; T = 8 / 32, M = 8 16"
            timeout -k 10 ${TRACE_S:-190} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/trace" \
                --shapes qwen3-30b-a3b --tokens 16 --budgets ${TRACE_BUDGETS:-8,10,12,16} --variants "$VARIANTS" \
                --trace-only ${TRACE_ONLY:-shipped,dn=64:64} --budget-s $(( ${TRACE_S:-190} - 40 )) \
                > "$OUT/trace/trace16.log" 2>&1 || status=1
            tail -40 "$OUT/trace/trace16.log" | cut -c1-160
            [ -n "${TRACE832-1}" ] || continue
            mkdir -p "$OUT/trace832"
            timeout -k 10 ${TRACE2_S:-70} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT/trace832" \
                --shapes qwen3-30b-a3b --tokens 8,32 --budgets 8,16 --variants shipped,dn=64:64,dn=64:128 \
                --trace-only none --budget-s $(( ${TRACE2_S:-70} - 30 )) \
                > "$OUT/trace832/trace.log" 2>&1 || status=1
            tail -16 "$OUT/trace832/trace.log" | cut -c1-160 ;;
        read) mkdir -p "$OUT/read"
            echo "=== read: one launch streaming the kept experts' bytes"
            timeout -k 10 ${READ_S:-75} python3 benchmarks/gpu/read_floor.py --out "$OUT/read" \
                --budgets 8,16 ${READ_ARGS:-} --budget-s $(( ${READ_S:-75} - 20 )) > "$OUT/read/read.log" 2>&1 || status=1
            grep -E "best|copy|tiles" "$OUT/read/read.log" | cut -c1-200 ;;
        ncu) mkdir -p "$OUT/ncu"
            echo "=== ncu: moe_one shipped / dn=64:64 and the read stream, Qwen3 T = 16, M = 8 / 16"
            timeout -k 10 ${NCU_S:-95} ncu --clock-control none --set full \
                --profile-from-start off -f -o "$OUT/ncu/moe" python3 benchmarks/gpu/ncu_moe_one.py \
                --tokens 16 --budgets 8 16 --variants shipped,dn=64:64 > "$OUT/ncu/ncu.log" 2>&1 || status=1
            tail -8 "$OUT/ncu/ncu.log" | cut -c1-200
            ncu --import "$OUT/ncu/moe.ncu-rep" --page details > "$OUT/ncu/ncu_details.txt" 2>&1 || status=1
            grep -E "^  [_a-z]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occ|L2 Hit" \
                "$OUT/ncu/ncu_details.txt" | cut -c1-120 | head -60
            rm -f "$OUT/ncu/moe.ncu-rep" ;;
        split)
            case "$gpu" in
                *H200*) OUT=$OUT/splitsweep PARTS=splitsweep SPLIT_T=1,2,4 SPLITSWEEP_S=${SPLITSWEEP_S:-120} \
                            bash benchmarks/gpu/run_route_h200.sh || status=1 ;;
                *) echo "=== split: not an H200 ($gpu): skipped" ;;
            esac ;;
        *) echo "unknown part '$part' (trace read ncu split)" >&2; exit 2 ;;
    esac
done
exit $status
