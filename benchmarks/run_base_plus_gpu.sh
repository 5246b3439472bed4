#!/usr/bin/env bash
# base_plus (the default policy) on a CUDA machine, in under 3 minutes, no model weights needed:
#   1. check_kernels_gpu.py --only base_plus: Triton kernel vs the torch core at Qwen3-30B-A3B's
#      shape (E=128 K=8 H=2048, T in 1/16/64; max |weight diff|, rows whose ids differ), a CUDA-graph
#      replay, and the selection latency of base vs base_plus (base_plus_latency.csv/.json);
#   2. the kernel tests of the combine modes on CUDA (tests/kernels/test_base_select_partial.py, its
#      gpu test at the Qwen3 shape included) and MoEPatch's Triton path vs its torch path for base
#      and base_plus (tests/engine/test_moe_hook_kernels.py).
# Usage (repository root): benchmarks/run_base_plus_gpu.sh [OUT_DIR]     (default $OUT or
# benchmarks/results/base_plus_gpu). Writes checks.json, base_plus_latency.{csv,json}, check.log,
# pytest.log under OUT_DIR; exit status 1 if any part failed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-${OUT:-benchmarks/results/base_plus_gpu}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
# base_sglang.kernels/.server live in kernels/ and server/ (pyproject package-dir): without an
# install, a package dir of symlinks maps them; pytest then runs from it (the checkout would shadow it)
source benchmarks/gpu_env.sh
map_package
RUN_DIR=${PKG:-$ROOT}
status=0
timeout 100 python3 benchmarks/check_kernels_gpu.py --only base_plus --out "$OUT" 2>&1 \
    | tee "$OUT/check.log" || status=1
(cd "$RUN_DIR" && timeout 75 python3 -m pytest -q -rfE -p no:cacheprovider --rootdir="$ROOT" \
    -c "$ROOT/pyproject.toml" "$ROOT/tests/kernels/test_base_select_partial.py" \
    "$ROOT/tests/engine/test_moe_hook_kernels.py") 2>&1 \
    | tee "$OUT/pytest.log" | tail -n 15 || status=1
echo "---- summary ----"
grep -E "^(PASS|FAIL) (base_plus|graph_replay_base_plus|latency)" "$OUT/check.log" \
    | sed -E 's/, "failures": \[\]//' || true
grep -E "^[0-9]+/[0-9]+ checks passed" "$OUT/check.log" || status=1
grep -E "[0-9]+ (passed|failed)" "$OUT/pytest.log" | tail -n 1 || status=1
grep -qE "[0-9]+ (failed|errors?)\b" "$OUT/pytest.log" && status=1
exit $status
