#!/usr/bin/env bash
# Issue-13 variants on the report split, both proxies, B = 8, 16, 64 (CPU, one job at a time).
#   bash benchmarks/run_variants_cpu.sh [PROXY2_DIR]      (PROXY2_DIR default .proxy2/proxy2-moe)
#   env: MODELS ("proxy proxy2"), OUT_DIR (benchmarks/results/q3), PROXY2_RESULTS (the proxy2 quality
#   runs and predictor, benchmarks/results/proxy2); the proxy2 schedule is measured (not re-derived)
#   when OUT_DIR has no schedule_proxy2.json
# Per model and B: run A = base_plus, oracle_plus, base_net, oracle_net at the budgets of the
# committed quality runs; run B = base_sched, oracle_sched at the scheduled budgets (<= 1.5k; above
# them the schedule is uniform, i.e. base_plus); then one merged file with the committed baseline
# rows (python -m base_sglang.calibration.sweep merge). Writes benchmarks/results/q3/report_*.
# The committed runs used transformers 5.17.0: use the same version, or the merge refuses the files
# (their dense NLL differs).
set -euo pipefail
export PYTHONUNBUFFERED=1
P2DIR=${1:-.proxy2/proxy2-moe}
R=benchmarks/results
Q=${OUT_DIR:-$R/q3}
P2R=${PROXY2_RESULTS:-$R/proxy2}
MODELS=${MODELS:-proxy proxy2}
mkdir -p "$Q"
C="--data base_sglang/data/heldout.txt --split report --prefix 64 --steps 64 --no-energy --quiet"
run() {  # name model predictor sched_predictor old_json batch num_batches "budgets" "sched budgets"
  local name=$1 model=$2 pred=$3 spred=$4 old=$5 b=$6 nb=$7 budgets=$8 sb=$9
  base-eval --model "$model" --predictor "$pred" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $budgets --policies base_plus,oracle_plus,base_net,oracle_net \
    --out "$Q/report_${name}_b${b}_net"
  base-eval --model "$model" --predictor "$spred" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $sb --policies base_sched,oracle_sched --out "$Q/report_${name}_b${b}_sched"
  python -m base_sglang.calibration.sweep merge "$Q/report_${name}_b${b}.json" \
    "$Q/report_${name}_b${b}_net.json" "$Q/report_${name}_b${b}_sched.json" "$old" ||
    echo "merge of report_${name}_b${b} failed (see above); the run files stand alone"
}
P1=base_sglang/models/proxy-moe
# the schedule files (predictor + layer_budget table) are not committed: rebuild them from the
# committed calibration curves (seconds; `layer_schedule` without --curves re-measures them, 5 min)
budgets() {  # the budgets of a committed quality run (its meta.settings)
  python -c "import json, sys; print(*json.load(open(sys.argv[1]))['meta']['settings']['budgets'])" "$1"
}
sched() {  # out_stem model predictor curves_json (measured when the curves file is absent)
  [ -f "$1.safetensors" ] && return
  if [ -f "$4" ]; then
    python -m base_sglang.calibration.layer_schedule --model "$2" --predictor "$3" \
      --data base_sglang/data/heldout.txt --out "$1" --curves "$4"
  else
    python -m base_sglang.calibration.layer_schedule --model "$2" --predictor "$3" \
      --data base_sglang/data/heldout.txt --out "$1"
  fi
}
for m in $MODELS; do case $m in
proxy)
  sched $Q/schedule_proxy_upto12 $P1 $P1/predictor.safetensors $R/q3/schedule_proxy.json
  run proxy $P1 $P1/predictor.safetensors $Q/schedule_proxy_upto12.safetensors \
    $R/quality_proxy_b8.json 8 8 "4 8 12 16 19 24 32 40 48" "4 8 12"
  run proxy $P1 $P1/predictor.safetensors $Q/schedule_proxy_upto12.safetensors \
    $R/quality_proxy_b16.json 16 4 "4 8 12 16 24 27 32 40 48" "4 8 12"
  run proxy $P1 $P1/predictor.safetensors $Q/schedule_proxy_upto12.safetensors \
    $R/quality_proxy_b64.json 64 1 "4 8 12 16 24 32 40 48 52 56 60" "4 8 12" ;;
proxy2)
  sched $Q/schedule_proxy2 "$P2DIR" $P2R/predictor.safetensors $Q/schedule_proxy2.json
  run proxy2 "$P2DIR" $P2R/predictor.safetensors $Q/schedule_proxy2.safetensors \
    $P2R/quality_b8.json 8 8 "$(budgets $P2R/quality_b8.json)" "2 4 6"
  run proxy2 "$P2DIR" $P2R/predictor.safetensors $Q/schedule_proxy2.safetensors \
    $P2R/quality_b16.json 16 4 "$(budgets $P2R/quality_b16.json)" "2 4 6"
  run proxy2 "$P2DIR" $P2R/predictor.safetensors $Q/schedule_proxy2.safetensors \
    $P2R/quality_b64.json 64 1 "$(budgets $P2R/quality_b64.json)" "2 4 6" ;;
*) echo "MODELS: unknown model '$m' (proxy, proxy2)" >&2; exit 2 ;;
esac; done
