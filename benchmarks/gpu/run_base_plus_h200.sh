#!/usr/bin/env bash
# base_plus (the default policy since issue 13) on one H200. Parts (default: kernels decode, ~7 min):
#   kernels  benchmarks/run_base_plus_gpu.sh: Triton kernel vs core at the Qwen3-30B-A3B shape, a
#            CUDA-graph replay, selection latency base vs base_plus, kernel/engine tests on CUDA
#            -> OUT/kernels/, OUT/kernels.log
#   decode   bench_decode.py in real SGLang (dummy Qwen3-30B-A3B, CUDA graphs, uniform-random router)
#            with the plugin's default policy (base_plus), B = 16 and 32, budgets dense/16/10/128
#            -> OUT/summary.json, OUT/decode.log
#   ab       the same at B=16, budgets dense/16/10, once with BASE_POLICY=base and once with the
#            default, one after the other in this call -> OUT/ab_base/, OUT/ab_base_plus/
#   bash benchmarks/gpu/run_base_plus_h200.sh [part...]   (repo root; carry .device_carry/*.tar.xz;
#                                                          proxy weights stay home: device-slim on)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-benchmarks/results/base_plus_h200}
mkdir -p "$OUT"
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(kernels decode)
status=0
decode() {  # decode POLICY OUT_DIR LOG ARGS...   (POLICY "" = the plugin's default)
    local policy=$1 dir=$2 logf=$3 pol; shift 3
    if [ -n "$policy" ]; then pol=(BASE_POLICY="$policy"); else pol=(-u BASE_POLICY); fi
    decode_run "$dir" "$logf" "${DECODE_S:-230}" "${pol[@]}" -- --profile-batch 0 "$@" || status=1
    grep -E "^ ?[0-9]+ |^ B |^--|policy" "$logf" | tail -12 || true
}
for part in "${PARTS[@]}"; do
    case "$part" in
        kernels)
            log "=== kernels"
            timeout -k 10 200 bash benchmarks/run_base_plus_gpu.sh "$OUT/kernels" > "$OUT/kernels.log" 2>&1 \
                || status=1
            tail -25 "$OUT/kernels.log" ;;
        decode|ab)
            [ -n "${SGL_ENV+x}" ] || { sgl_setup; project_check; }
            export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
            if [ "$part" = decode ]; then
                log "=== SGLang decode, default policy"
                decode "" "$OUT" "$OUT/decode.log" --batches 16 32 \
                    --budgets dense 16 10 128 --time-budget "${DECODE_BUDGET_S:-150}"
            else
                log "=== SGLang decode A/B: base, then the default (base_plus)"
                decode base "$OUT/ab_base" "$OUT/ab_base.log" --batches 16 \
                    --budgets dense 16 10 --time-budget 60
                decode "" "$OUT/ab_base_plus" "$OUT/ab_base_plus.log" --batches 16 \
                    --budgets dense 16 10 --time-budget 60
            fi ;;
        *) echo "unknown part '$part' (kernels, decode, ab)" >&2; exit 2 ;;
    esac
done
exit $status
