#!/usr/bin/env bash
# Kernel checks + benchmarks on one CUDA machine in one call (< 8 min on an H200): what BENCHMARKS.md
# "Kernels (H200)" quotes, and the issue-12 targets, met or missed, printed last.
#
#   BASE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_kernels_gpu.sh [OUT_DIR]
# OUT_DIR defaults to $OUT (the device tool's output folder), else benchmarks/results/kernels_h200.
# Writes 7 files there: checks.json, fused_moe.csv/.json, base_select.csv/.json, run.log, report.txt.
# SGLang's Triton MoE (the dense comparison) is loaded from .device_carry/sglang-0.5.23/ (made by
# benchmarks/fetch_sglang_moe.sh; ~2.5 MB, carry it) or from the wheel in .whl/; without either the
# SGLang columns are skipped. The proxy model weights are not used.
# Parts run under their own time limits and write results as they go; a part that fails or runs out
# of time does not stop the next one. Exit status: that of the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-benchmarks/results/kernels_h200}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/base-sglang-triton-cache}  # shared by the parts
LOG="$OUT_DIR/run.log"
: > "$LOG"
if ! python3 -c "import base_sglang.kernels" 2>/dev/null; then  # not pip-installed: map kernels/ by hand
    rm -rf /tmp/pkg && mkdir -p /tmp/pkg && cp -r base_sglang /tmp/pkg/ && cp -r kernels /tmp/pkg/base_sglang/kernels
    export PYTHONPATH=/tmp/pkg
fi
SGL_ROOT=""
if [ -d .device_carry/sglang-0.5.23/sglang ]; then
    SGL_ROOT=.device_carry/sglang-0.5.23
elif compgen -G ".whl/sglang-0.5.23-*.whl" > /dev/null; then
    python3 benchmarks/fetch_sglang_moe.py --wheel .whl --dest /tmp/sglang_whl | tee -a "$LOG"
    SGL_ROOT=/tmp/sglang_whl
else
    echo "no SGLang 0.5.23 sources (.device_carry/sglang-0.5.23 or .whl/): SGLang columns skipped" | tee -a "$LOG"
fi
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')" | tee -a "$LOG"

CHECK_RC=0
part() {  # part NAME LIMIT_S CMD...: run under a time limit, log, never abort the script
    local name=$1 limit=$2 rc=0 t0=$SECONDS
    shift 2
    echo "=== $name (limit ${limit} s)" | tee -a "$LOG"
    timeout -k 10 "$limit" "$@" >> "$LOG" 2>&1 || rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    return $rc
}
part checks 110 python3 benchmarks/check_kernels_gpu.py --out "$OUT_DIR" || CHECK_RC=$?
grep -E "^(FAIL|[0-9]+/[0-9]+ checks)" "$LOG" || true
part fused_moe 250 python3 benchmarks/bench_fused_moe.py --out "$OUT_DIR" --sglang-root "$SGL_ROOT" \
    --deadline-s 215 || true
part base_select 75 python3 benchmarks/bench_base_select.py --out "$OUT_DIR" --deadline-s 50 || true
python3 benchmarks/kernel_report.py --dir "$OUT_DIR" 2>&1 | tee "$OUT_DIR/report.txt"
exit $CHECK_RC
