#!/usr/bin/env bash
# Issue 12 end to end: this checkout's tuned kernel table (kernels/configs/NVIDIA_H200.json) in
# SGLang's decode step against an older table, one device call (~40-60 s per run after the first).
# SGLang 0.5.17, dummy Qwen3-30B-A3B, CUDA graphs, uniform-random routing, plugin on, at BATCHES
# (default "8 16 32"), BUDGETS (default 16), one profiled graph step at PROFILE_B (default 8).
#   ORDER="new old new old" (default): "new" runs the checkout's table, "old" copies OLD_TABLE over
#   it first (restored on exit); the n-th run of a kind writes OUT/e2e_<kind> (n = 1) or
#   OUT/e2e_<kind>_<n>, so the repeats show the drift between sequential runs.
#   -> OUT/e2e_*/summary.json, profile_b16.json (bench_decode's name, whatever PROFILE_B is), e2e_*.log
# Usage (repository root; carry .device_carry/*.tar.xz; proxy weights home: device-slim on):
#   OUT=/path OLD_TABLE=path/to/NVIDIA_H200.json [BASE_COMMIT=sha] bash benchmarks/gpu/run_table_e2e_h200.sh
# Tables: python benchmarks/kernel_tables.py runs_e2e OUT ; python benchmarks/kernel_tables.py profile OUT
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
OUT=${OUT:-benchmarks/results/kernels_h200_table}
OLD_TABLE=${OLD_TABLE:?OLD_TABLE: the table file to compare against}
[ -f "$OLD_TABLE" ] || { echo "OLD_TABLE: no such file: $OLD_TABLE" >&2; exit 2; }
for kind in ${ORDER:-new old new old}; do
    [[ "$kind" == new || "$kind" == old ]] || { echo "ORDER: new or old, got $kind" >&2; exit 2; }
done
TABLE=kernels/configs/NVIDIA_H200.json
mkdir -p "$OUT"
cp "$TABLE" "$OUT/.new_table.json"
restore() { cp "$OUT/.new_table.json" "$TABLE" && rm -f "$OUT/.new_table.json"; stop_all_groups; }
source benchmarks/gpu/lib.sh
trap restore EXIT
status=0
sgl_setup
project_check
export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
read -r -a batches <<< "${BATCHES:-8 16 32}"
read -r -a budgets <<< "${BUDGETS:-16}"
declare -A seen=()
for kind in ${ORDER:-new old new old}; do
    case "$kind" in
        new) cp "$OUT/.new_table.json" "$TABLE" ;;
        old) cp "$OLD_TABLE" "$TABLE" ;;
    esac
    n=$(( ${seen[$kind]:-0} + 1 )); seen[$kind]=$n
    name=e2e_$kind; [ "$n" -gt 1 ] && name=${name}_$n
    same=$(cmp -s "$TABLE" "$OLD_TABLE" && echo "the same file as" || echo "differs from")
    log "=== SGLang decode with the $kind table ($name; it $same OLD_TABLE)"
    decode_run "$OUT/$name" "$OUT/$name.log" "${DECODE_S:-150}" -- --profile-batch "${PROFILE_B:-8}" \
        --profile-budgets "${budgets[@]}" --batches "${batches[@]}" --budgets "${budgets[@]}" \
        --rounds "${ROUNDS:-3}" --time-budget "${DECODE_BUDGET_S:-110}" || status=1
    grep -E "^ ?[0-9]+ |^ B |^--|\[profile\]" "$OUT/$name.log" | cut -c1-160 | tail -8 || true
done
exit $status
