#!/usr/bin/env bash
# BASE inside real SGLang with tensor parallelism 2 on two H200s (issue 17), one device call
# (kind nvidia-h200-x2, < 10 minutes):
#   bash benchmarks/gpu/run_tp2_h200.sh [bench_tp.py flags]     (from the repo root; results in $OUT)
# Parts, each under `timeout` within one overall deadline (DEADLINE_S, default 570 s):
#   tp2       bench_tp.py --tp 2: both ranks keep the same experts and weights in every decode step
#             (per-rank selection traces compared: ranks_agree), then decode tok/s at B = 16, 32, 64
#             for dense and M = 8, 10, 16, and the B=16 profile     -> summary.json,
#             profile_b16_tp2.json, trace/sel.rank0.jsonl, trace/sel.rank1.jsonl
#   tp1       bench_tp.py --tp 1 on GPU 0: the same sweep on one GPU   -> summary_tp1.json,
#             profile_b16_tp1.json
#   finalize  the TP=1 comparison into summary.json, its schema check, the tables
# SGLang comes from /tmp/sgl-bundle/env.sh, else .device_carry/*.tar.xz via install_bundle.sh (carry
# .device_carry; the proxy weights need not travel), else an installed sglang. The exit status is 0
# only if every part ran and the ranks agreed. Everything printed is also in $OUT/run_tp2_h200.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there
# NVLink multicast stays off (the device's rule), for this shell and every process it starts:
# NCCL, torch symmetric memory, NVSHMEM. SGLang's symmetric-memory all-reduce (v2) is off too
# (bench_tp.py also passes --enforce-disable-flashinfer-allreduce-fusion): the legacy CUDA-IPC
# custom all-reduce and NCCL carry the TP collectives.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=0
OUT=${OUT:-benchmarks/results/sglang_h200_tp2}
DEADLINE_S=${DEADLINE_S:-570}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_tp2_h200.log") 2>&1
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT

log "OUT=$OUT; commit ${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo ?)}; deadline ${DEADLINE_S} s"
log "env: NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2=$SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2"
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader || true
nvidia-smi topo -m 2>/dev/null | head -5 || true
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -lt 2 ]; then
    log "needs 2 GPUs (device kind nvidia-h200-x2), found ${ngpu:-0}"
    exit 2
fi
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

status=0
# tp2: the ranks stop themselves 20 s before the part's limit (rank-timeout), the sweep starts no
# new batch size after limit - 90 s (time-budget, counted from each rank's start)
cap2=330
left=$((DEADLINE_S - SECONDS - 15)); lim2=$(( cap2 < left ? cap2 : left ))
run_part tp2 "$cap2" bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/bench_tp.py --tp 2 \
    --out "$OUT" --rank-timeout $((lim2 - 20)) --time-budget $((lim2 - 90)) "$@" || status=1
cap1=200
left=$((DEADLINE_S - SECONDS - 15)); lim1=$(( cap1 < left ? cap1 : left ))
run_part tp1 "$cap1" env CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu/sgl_exec.sh python3 \
    benchmarks/gpu/bench_tp.py --tp 1 --out "$OUT" --time-budget $((lim1 - 60)) "$@" || status=1

part_summary
with_sgl python3 benchmarks/gpu/bench_tp.py --finalize --out "$OUT" || status=1
ls -la "$OUT" "$OUT/trace" 2>/dev/null || true
log "done in $SECONDS s, status $status"
exit $status
