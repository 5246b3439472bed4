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
if ! python3 -c "import base_sglang.kernels" 2>/dev/null; then  # not pip-installed: map kernels/ by hand
    mkdir -p /tmp/pkg && cp -r base_sglang /tmp/pkg/ && cp -r kernels /tmp/pkg/base_sglang/kernels
    export PYTHONPATH=/tmp/pkg
fi
python3 - <<'PY'
import glob, zipfile
z = zipfile.ZipFile(glob.glob(".whl/sglang-0.5.23-*.whl")[0])
names = [n for n in z.namelist() if n.startswith(("sglang/kernels/ops/moe/",
                                                  "sglang/srt/layers/moe/moe_runner/triton_utils/"))]
z.extractall("/tmp/sglang_whl", names)
print(len(names), "files unpacked from the sglang wheel")
PY
python3 benchmarks/check_kernels_gpu.py --out "$OUT" ${2:-} 2>&1 | tee "$OUT/check.log"
python3 benchmarks/bench_fused_moe.py --out "$OUT" --sglang-root /tmp/sglang_whl 2>&1 | tee "$OUT/bench_fused_moe.log"
python3 benchmarks/bench_base_select.py --out "$OUT" 2>&1 | tee "$OUT/bench_base_select.log"
