#!/usr/bin/env bash
# GPU validation on a CUDA machine: the gpu-marked tests (core in a CUDA graph, the engine on CUDA,
# MoEPatch's Triton path vs its torch path) and the native engine's decode speed with the proxy model.
# Usage: benchmarks/run_gpu_validation.sh [OUT_DIR]     (needs base_sglang/models/proxy-moe)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/gpu_validation}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    mkdir -p /tmp/pkg && cp -r base_sglang /tmp/pkg/ && for d in kernels server calibration; do
        cp -r "$d" "/tmp/pkg/base_sglang/$d"; done
    export PYTHONPATH=/tmp/pkg
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -m gpu -q -rA tests/core tests/engine 2>&1 | tee "$OUT/gpu_tests.log"
BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)} python3 benchmarks/bench_engine.py --device cuda --dtype bfloat16 --batch 1 8 32 \
    --budgets dense 32 16 8 --steps 30 --repeats 2 --num-threads 4 --out "$OUT" --tag engine_h200 \
    2>&1 | grep -v "Loading weights" | tee "$OUT/bench_engine.log"
