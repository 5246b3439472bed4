#!/usr/bin/env bash
# Kernel checks + benchmarks on one CUDA machine in one call (< 8 min on an H200): what BENCHMARKS.md
# "Kernels (H200)" quotes, and the issue-12 targets, met or missed, printed last.
#
#   BASE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_kernels_gpu.sh [OUT_DIR]
# OUT_DIR defaults to $OUT (the device tool's output folder), else benchmarks/results/kernels_h200.
# Writes 7 files there: checks.json, fused_moe.csv/.json, base_select.csv/.json, run.log, report.txt.
# SGLang's Triton MoE (the dense comparison) is loaded from .device_carry/sglang-0.5.23/ (made by
# benchmarks/fetch_sglang_moe.py; 2.5 MB, carry it) or from the wheel in .whl/; without either the
# SGLang columns are skipped. The proxy model weights are not used.
# Phases: (1) in parallel, untimed: WARM_WORKERS processes compile every kernel variant the
# benchmarks will launch into one Triton cache, and one correctness-check process per shape runs;
# (2) alone on the GPU: the MoE benchmark, then the selection benchmark; (3) the report.
# Every phase has a time limit and writes results as it goes; a phase that fails or runs out of time
# does not stop the next one. Exit status: that of the checks.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-${OUT:-benchmarks/results/kernels_h200}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/base-sglang-triton-cache}  # shared by all phases
WARM_WORKERS=${WARM_WORKERS:-11}
LOG="$OUT_DIR/run.log"
SCRATCH=$(mktemp -d /tmp/base-kernels.XXXX)
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
SGL_ARG=()
[ -n "$SGL_ROOT" ] && SGL_ARG=(--sglang-root "$SGL_ROOT")

part() {  # part NAME LIMIT_S CMD...: run under a time limit, log, never abort the script
    local name=$1 limit=$2 rc=0 t0=$SECONDS
    shift 2
    echo "=== $name (limit ${limit} s)" | tee -a "$LOG"
    timeout -k 10 "$limit" "$@" >> "$LOG" 2>&1 || rc=$?
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
    return $rc
}

# ---- phase 1: compile everything (parallel) + correctness checks (one process per shape) -------
t1=$SECONDS
pids=()
for i in $(seq 0 $((WARM_WORKERS - 1))); do
    timeout -k 10 150 python3 benchmarks/warm_kernels.py --worker "$i" --workers "$WARM_WORKERS" \
        ${SGL_ARG[@]+"${SGL_ARG[@]}"} > "$SCRATCH/warm_$i.log" 2>&1 &
    pids+=($!)
done
shards=()
for shape in qwen3-30b-a3b olmoe-1b-7b mixtral-8x7b; do
    mkdir -p "$SCRATCH/check_$shape"
    timeout -k 10 170 python3 benchmarks/check_kernels_gpu.py --shapes "$shape" \
        --out "$SCRATCH/check_$shape" > "$SCRATCH/check_$shape.log" 2>&1 &
    pids+=($!)
    shards+=("$SCRATCH/check_$shape")
done
# the native engine's Triton path (MoEPatch: base_select_experts + fused_moe) vs its torch path
# (-P: the repo root must not shadow the /tmp/pkg mapping of kernels/ into base_sglang)
mkdir -p "$SCRATCH/check_engine"
( rc=0; timeout -k 10 150 python3 -P -m pytest -q -p no:cacheprovider tests/engine/test_moe_hook_kernels.py \
      > "$SCRATCH/check_engine.log" 2>&1 || rc=$?
  python3 -c "import json, sys; json.dump({'checks': [{'check': 'engine/test_moe_hook_kernels (pytest)', 'ok': sys.argv[1] == '0', 'exit': int(sys.argv[1])}]}, open(sys.argv[2], 'w'))" \
      "$rc" "$SCRATCH/check_engine/checks.json" ) &
pids+=($!)
shards+=("$SCRATCH/check_engine")
for p in "${pids[@]}"; do wait "$p" || true; done
echo "=== phase 1 (compile + checks) done after $((SECONDS - t1)) s" | tee -a "$LOG"
cat "$SCRATCH"/check_*.log >> "$LOG"
tail -n 2 "$SCRATCH"/warm_*.log >> "$LOG"
CHECK_RC=0
python3 benchmarks/check_kernels_gpu.py --out "$OUT_DIR" --merge "${shards[@]}" 2>&1 | tee -a "$LOG" \
    | tail -n 1 || CHECK_RC=$?
grep -h "^FAIL" "$SCRATCH"/check_*.log || true

# ---- phase 2: timed, alone on the GPU ------------------------------------------------------------
MOE_S=${KERNELS_MOE_DEADLINE_S:-170} SELECT_S=${KERNELS_SELECT_DEADLINE_S:-50}
part fused_moe $((MOE_S + 30)) python3 benchmarks/bench_fused_moe.py --out "$OUT_DIR" \
    ${SGL_ARG[@]+"${SGL_ARG[@]}"} --deadline-s "$MOE_S" || true
part base_select $((SELECT_S + 20)) python3 benchmarks/bench_base_select.py --out "$OUT_DIR" \
    --deadline-s "$SELECT_S" || true

# ---- phase 3: the targets --------------------------------------------------------------------
python3 benchmarks/kernel_report.py --dir "$OUT_DIR" 2>&1 | tee "$OUT_DIR/report.txt"
rm -rf "$SCRATCH"
exit $CHECK_RC
