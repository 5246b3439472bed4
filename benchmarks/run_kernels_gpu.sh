#!/usr/bin/env bash
# Kernel checks + benchmarks on a CUDA machine (what BENCHMARKS.md "Kernels (H200)" quotes).
# Needs the sglang 0.5.23 wheel in .whl/ (here: python3 -m pip download --no-deps sglang==0.5.23 -d .whl/);
# only its Triton MoE files are unpacked, to /tmp/sglang_whl, and loaded by sglang_triton_moe.py.
# Usage: BASE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_kernels_gpu.sh [OUT_DIR] [--quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/kernels_h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
source benchmarks/gpu_env.sh
map_package  # not pip-installed: a package of links
unpack_sglang_wheel
python3 benchmarks/check_kernels_gpu.py --out "$OUT" ${2:-} 2>&1 | tee "$OUT/check.log"
python3 benchmarks/bench_fused_moe.py --out "$OUT" --sglang-root /tmp/sglang_whl 2>&1 | tee "$OUT/bench_fused_moe.log"
python3 benchmarks/bench_base_select.py --out "$OUT" 2>&1 | tee "$OUT/bench_base_select.log"
