#!/usr/bin/env bash
# BASE inside real SGLang on one H200 (issue 11): pick the parts that fit one device call.
#   bash benchmarks/gpu/run_sglang_h200.sh [part...]      (from the repo root; results in $OUT)
# Parts (default: decode):
#   decode-uniform  bench_decode.py, plugin on, random router     -> summary.json, profile_b16.json
#   decode-off      bench_decode.py, BASE_PREDICTOR unset         -> "off" rows of summary.json
#   decode-skewed   bench_decode.py, plugin on, skewed router     -> summary_skewed.json
#   decode          the three above (~8 min: better split over two calls)
#   proxy           check_proxy_sglang.py, both stages            -> proxy_sglang.json, proxy_check.json
#                   (needs base_sglang/models/proxy-moe: the weights travel, so the bundle must
#                   already be at /tmp/sgl-bundle from an earlier call on the same warm machine)
#   server          check_server_sglang.sh                        -> server_checks.json, bench_serving.jsonl,
#                   serving_summary.json, base_serve.log, launch_server.log
# SGLang comes from /tmp/sgl-bundle/env.sh, else .device_carry/*.tar.xz via install_bundle.sh, else
# an installed sglang. Every part runs under `timeout`; a part that fails does not stop the others;
# the exit status is 1 if any failed. All output is also in $OUT/run_sglang_h200.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there
OUT=${OUT:-benchmarks/results/sglang_h200}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run_sglang_h200.log") 2>&1
source benchmarks/gpu/lib.sh
trap stop_all_groups EXIT

PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(decode)
expanded=()
for p in "${PARTS[@]}"; do
    case "$p" in
        decode|3) expanded+=(decode-uniform decode-off decode-skewed) ;;
        decode-uniform|decode-off|decode-skewed|proxy|server) expanded+=("$p") ;;
        4) expanded+=(proxy) ;;
        5) expanded+=(server) ;;
        *) echo "unknown part '$p' (decode, decode-uniform, decode-off, decode-skewed, proxy, server)" >&2
           exit 2 ;;
    esac
done

log "parts: ${expanded[*]}; OUT=$OUT; commit ${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo ?)}"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader || true
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}

status=0
for part in "${expanded[@]}"; do
    case "$part" in
        decode-uniform)
            run_part "$part" 230 bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/bench_decode.py \
                --routing uniform-random --plugin on --out "$OUT" || status=1 ;;
        decode-off)
            run_part "$part" 200 bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/bench_decode.py \
                --routing uniform-random --plugin off --out "$OUT" || status=1 ;;
        decode-skewed)
            run_part "$part" 230 bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/bench_decode.py \
                --routing skewed --plugin on --out "$OUT" || status=1 ;;
        proxy)
            run_part proxy-sglang 240 bash benchmarks/gpu/sgl_exec.sh python3 \
                benchmarks/gpu/check_proxy_sglang.py sglang --out "$OUT" || status=1
            # the references on the device's own transformers (not the bundle's 5.12.1)
            run_part proxy-reference 180 python3 benchmarks/gpu/check_proxy_sglang.py reference \
                --out "$OUT" || status=1 ;;
        server)
            run_part server 560 bash benchmarks/gpu/check_server_sglang.sh "$OUT" || status=1 ;;
    esac
done

part_summary
if ls "$OUT"/summary*.json >/dev/null 2>&1; then
    with_sgl python3 benchmarks/gpu/bench_decode.py --report --out "$OUT" || true
fi
exit $status
