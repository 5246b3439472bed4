#!/usr/bin/env bash
# Issue 12 on one H200, one device call (< 9 min): the folded router (kernels/base_route.py).
#   check    check_kernels_gpu.py --only route: route-select == core.routing at three shapes, T up to
#            128, every budget kind, base / base_plus, backfill on/off, repeat calls bitwise equal, a
#            CUDA graph of GEMM + route-select with changed budgets == eager; base_sched with two
#            batch-size ranges in both unfolded selection kernels     -> OUT/checks.json, check.log
#   compact  check_kernels_gpu.py --only compact: the narrow backfill (|S| <= COMPACT) against the
#            same tiles with it off, bitwise (ids, weights, counts), Qwen3 and OLMoE at T 1-64,
#            budgets at, below and above the width        -> OUT/checks.json, compact.log (more than
#            150 s on a fresh machine: 4 Qwen3 cells in 150 s, seventh session; give it a call)
#            COMPACT_SHAPES (default both) restricts it, e.g. olmoe-1b-7b
#   sched    check_kernels_gpu.py --only sched: base_sched in both unfolded selection kernels
#                                                                     -> OUT/checks.json, sched.log
#   split    check_kernels_gpu.py --only split: the two-launch route-select (base_route_split) ==
#            core.routing at three shapes, T 16/64/128, its tilings, == the one launch bitwise at
#            the same tiling, repeat calls, a graph replay            -> OUT/checks.json, split.log
#   splitsweep gpu/sweep_split.py: router / one launch / unfolded / two launches (each tiling)
#            at T 8-128                                               -> OUT/sweep_split.json
#   pytest   tests/kernels on CUDA (PYTEST_PATHS: other test paths)   -> OUT/pytest.log
#   select   bench_base_select.py: the unfolded selection as before, and the dense routing, the folded
#            routing + BASE, the unfolded path after the dense routing, torch's top-k; shares of the
#            dense layers of benchmarks/results/kernels_h200_moe/final  -> OUT/base_select.{csv,json}
#            (DENSE_FROM: another folder's fused_moe.json, e.g. run_moe_h200.sh's part full; a
#            folder without one: our dense layer timed here)
#   sweep    gpu/sweep_route.py: (num_warps, rows per block, top-k method) of the folded launch
#                                                                      -> OUT/sweep_route.json
#   profile  gpu/profile_moe.py: per-kernel time of selection + fused_moe -> OUT/profile_moe.json
#   ncu      Nsight Compute on one launch of each selection kernel, Qwen3 shape, T = 16 and 64
#            (gpu/ncu_select.py): the details page (speed of light, stalls) and the per-line
#            source page, summarised by gpu/ncu_summary.py (instructions per warp, straight runs)
#                                  -> OUT/ncu_details.txt, ncu_source_*.csv, ncu_sass_summary.json
# Usage (repository root, proxy weights home, nothing to carry):
#   OUT=/path [BASE_COMMIT=sha] [PARTS="check pytest select profile"] bash benchmarks/gpu/run_route_h200.sh
# One call fits about two parts: check (over 230 s since the narrow backfill: 47 checks in 230 s,
# sched not reached, seventh session) and pytest (<= 280 s, the whole tests/kernels
# compiles on the GPU) each fill most of one; select (~170 s) and profile (~120 s) fit together.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu_env.sh
kernel_run_env benchmarks/results/kernels_h200_route
PARTS=${PARTS:-check pytest select profile}
status=0
for part in $PARTS; do
    case "$part" in
        check) echo "=== checks (route, sched)"
            timeout -k 10 ${CHECK_S:-240} python3 benchmarks/check_kernels_gpu.py --only route --out "$OUT" \
                > "$OUT/check.log" 2>&1 || status=1
            grep -E "FAIL|checks passed" "$OUT/check.log" | cut -c1-200 | tail -12 ;;
        compact) echo "=== narrow backfill == full tile, bitwise"
            timeout -k 10 ${COMPACT_S:-300} python3 benchmarks/check_kernels_gpu.py --only compact --out "$OUT" \
                --shapes ${COMPACT_SHAPES:-qwen3-30b-a3b,olmoe-1b-7b} > "$OUT/compact.log" 2>&1 || status=1
            grep -E "FAIL|checks passed" "$OUT/compact.log" | cut -c1-200 | tail -12 ;;
        sched) echo "=== base_sched in both selection kernels == core"
            timeout -k 10 ${SCHED_S:-120} python3 benchmarks/check_kernels_gpu.py --only sched --out "$OUT" \
                > "$OUT/sched.log" 2>&1 || status=1
            grep -E "FAIL|checks passed" "$OUT/sched.log" | cut -c1-200 | tail -8 ;;
        split) echo "=== two-launch route-select == core"
            timeout -k 10 ${SPLIT_S:-200} python3 benchmarks/check_kernels_gpu.py --only split --out "$OUT" \
                > "$OUT/split.log" 2>&1 || status=1
            grep -E "FAIL|checks passed" "$OUT/split.log" | cut -c1-200 | tail -12 ;;
        splitsweep) echo "=== two-launch route-select timing"
            timeout -k 10 ${SPLITSWEEP_S:-200} python3 benchmarks/gpu/sweep_split.py --out "$OUT" \
                --budget-s $(( ${SPLITSWEEP_S:-200} - 20 )) --tokens ${SPLIT_T:-8,16,32,64,128} \
                > "$OUT/splitsweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/splitsweep.log" | cut -c1-200 | tail -14 ;;
        pytest) echo "=== tests/kernels on CUDA"
            (cd "${PKG:-$ROOT}" && timeout -k 10 ${PYTEST_S:-280} python3 -m pytest -q -rfE -p no:cacheprovider \
                --rootdir="$ROOT" -c "$ROOT/pyproject.toml" ${PYTEST_PATHS:-"$ROOT/tests/kernels"} \
                > "$OUT/pytest.log" 2>&1) || status=1
            grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -8 ;;
        select) echo "=== selection and folded routing latency"
            nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
            timeout -k 10 ${SELECT_S:-180} python3 benchmarks/bench_base_select.py --out "$OUT" \
                --shapes ${SHAPES:-qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b} \
                --tokens ${TOKENS:-1,8,16,32,64} --dense-from ${DENSE_FROM:-benchmarks/results/kernels_h200_moe/final} \
                > "$OUT/bench.log" 2>&1 || status=1
            grep -v -i warn "$OUT/bench.log" | cut -c1-200 | tail -20 ;;
        sweep) echo "=== route-select tiles and top-k method"
            timeout -k 10 ${SWEEP_S:-300} python3 benchmarks/gpu/sweep_route.py --out "$OUT" \
                --budget-s $(( ${SWEEP_S:-300} - 30 )) --tokens ${TOKENS:-1,8,16,32,64} \
                > "$OUT/sweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/sweep.log" | cut -c1-200 | tail -20 ;;
        profile) echo "=== per-kernel time of selection + fused_moe in a graph"
            timeout -k 10 ${PROFILE_S:-120} python3 benchmarks/gpu/profile_moe.py --out "$OUT" \
                > "$OUT/profile.log" 2>&1 || status=1
            grep -v -i warn "$OUT/profile.log" | cut -c1-140 | tail -40 ;;
        ncu) echo "=== Nsight Compute: the selection kernels at Qwen3 T = 16, 64"
            timeout -k 10 ${NCU_S:-150} ncu --clock-control none --set full --import-source yes \
                --profile-from-start off -f -o "$OUT/sel" python3 benchmarks/gpu/ncu_select.py \
                --tokens ${NCU_T:-16 64} > "$OUT/ncu.log" 2>&1 || status=1
            tail -5 "$OUT/ncu.log" | cut -c1-200
            rep="$OUT/sel.ncu-rep"
            ncu --import "$rep" --page details > "$OUT/ncu_details.txt" 2>&1 || status=1
            grep -E "^  [a-z_]+.*\(|Duration|Warp Cycles Per Issued|Registers Per|Achieved Occ" \
                "$OUT/ncu_details.txt" | cut -c1-120 | head -60
            for src in cuda sass; do
                ncu --import "$rep" --page source --csv --print-source "$src" \
                    > "$OUT/ncu_source_$src.csv" 2>> "$OUT/ncu_source.err" || status=1
                echo "source page ($src): $(wc -l < "$OUT/ncu_source_$src.csv") lines"
            done
            python3 benchmarks/gpu/ncu_summary.py "$OUT/ncu_source_sass.csv" "$OUT/ncu_details.txt" \
                "$OUT/ncu_sass_summary.json" || status=1
            head -c 600 "$OUT/ncu_source.err"; rm -f "$rep" ;;
        *) echo "unknown part '$part' (check compact sched split splitsweep pytest select sweep profile ncu)" >&2; exit 2 ;;
    esac
done
exit $status
