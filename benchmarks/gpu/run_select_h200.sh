#!/usr/bin/env bash
# Issue 12 on one H200, one device call (< 9 min): the one-launch selection (base_fused_select).
#   1. check_kernels_gpu.py --only fused: kernel == core at three shapes and every budget kind, CUDA
#      graph replays == eager, base_plus at Qwen3's shape, the grid barrier under alternating grids,
#      two streams and the plain launch                                  -> OUT/checks.json, check.log
#   2. sweep_fused_tiles.py: (num_warps, ROWS) of the fused kernel         -> OUT/fused_tiles.json
#   3. bench_base_select.py: empty launch, the two-launch pair, the fused one (cooperative, plain,
#      no PDL), the default dispatch, the torch core; share of the dense layer of
#      benchmarks/results/kernels_h200                                    -> OUT/base_select.{csv,json}
#   4. tests/kernels on CUDA (every kernel test against the core)          -> OUT/pytest.log
#   5. bench_fused_moe.py at T = 1, 8 (Qwen3) with SGLang's Triton align inside its timed region
#      (sglang_align_us)                                                   -> OUT/fused_moe.{csv,json}
# Usage (repository root, carry .whl/ with the sglang 0.5.23 wheel, proxy weights stay home):
#   OUT=/path [BASE_COMMIT=sha] bash benchmarks/gpu/run_select_h200.sh
# PARTS="barrier select" runs a short form (~2 min, no wheel needed): check section 7 alone, then
# part 3 for Qwen3 and OLMoE at T <= 64.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu_env.sh
kernel_run_env benchmarks/results/kernels_h200_fused
if [ -n "${PARTS:-}" ]; then
    for part in $PARTS; do
        case "$part" in
            barrier) timeout -k 10 90 python3 benchmarks/check_kernels_gpu.py --only barrier --out "$OUT" \
                         2>&1 | tee "$OUT/check_barrier.log" | grep -E "PASS|FAIL|checks passed" ;;
            select) timeout -k 10 150 python3 benchmarks/bench_base_select.py --out "$OUT" \
                        --shapes qwen3-30b-a3b,olmoe-1b-7b --tokens 1,8,16,32,64 \
                        --dense-from benchmarks/results/kernels_h200 2>&1 | grep -v -i warn \
                        | tee "$OUT/bench_base_select.log" ;;
            *) echo "unknown part '$part' (barrier, select)" >&2; exit 2 ;;
        esac
    done
    exit 0
fi
unpack_sglang_wheel
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "=== 1. checks"
timeout -k 10 150 python3 benchmarks/check_kernels_gpu.py --only fused --out "$OUT" > "$OUT/check.log" 2>&1 || status=1
grep -E "PASS|FAIL|checks passed" "$OUT/check.log" | cut -c1-160
echo "=== 2. tile sweep of the fused kernel"
timeout -k 10 60 python3 benchmarks/gpu/sweep_fused_tiles.py --out "$OUT" > "$OUT/sweep.log" 2>&1 || status=1
grep -v -i warn "$OUT/sweep.log" | tail -10
echo "=== 3. selection latency"
timeout -k 10 120 python3 benchmarks/bench_base_select.py --out "$OUT" \
    --dense-from benchmarks/results/kernels_h200 > "$OUT/bench_base_select.log" 2>&1 || status=1
grep -v -i warn "$OUT/bench_base_select.log" | tail -20
echo "=== 4. tests/kernels on CUDA"
(cd "${PKG:-$ROOT}" && timeout -k 10 100 python3 -m pytest -q -rfE -p no:cacheprovider --rootdir="$ROOT" \
    -c "$ROOT/pyproject.toml" "$ROOT/tests/kernels" > "$OUT/pytest.log" 2>&1) || status=1
tail -3 "$OUT/pytest.log"
echo "=== 5. MoE layer at T = 1, 8 (Qwen3) with SGLang's align timed"
timeout -k 10 70 python3 benchmarks/bench_fused_moe.py --out "$OUT" --sglang-root /tmp/sglang_whl \
    --shapes qwen3-30b-a3b --tokens 1,8 > "$OUT/bench_fused_moe.log" 2>&1 || status=1
tail -16 "$OUT/bench_fused_moe.log"
exit $status
