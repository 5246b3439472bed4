#!/usr/bin/env bash
# Issue-13 variants on the report split, both proxies, B = 8, 16, 64 (CPU, one job at a time).
#   bash benchmarks/run_variants_cpu.sh [PROXY2_DIR]      (PROXY2_DIR default .proxy2/proxy2-moe)
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
C="--data base_sglang/data/heldout.txt --split report --prefix 64 --steps 64 --no-energy --quiet"
run() {  # name model predictor sched_predictor old_json batch num_batches "budgets" "sched budgets"
  local name=$1 model=$2 pred=$3 spred=$4 old=$5 b=$6 nb=$7 budgets=$8 sb=$9
  base-eval --model "$model" --predictor "$pred" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $budgets --policies base_plus,oracle_plus,base_net,oracle_net \
    --out "$R/q3/report_${name}_b${b}_net"
  base-eval --model "$model" --predictor "$spred" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $sb --policies base_sched,oracle_sched --out "$R/q3/report_${name}_b${b}_sched"
  python -m base_sglang.calibration.sweep merge "$R/q3/report_${name}_b${b}.json" \
    "$R/q3/report_${name}_b${b}_net.json" "$R/q3/report_${name}_b${b}_sched.json" "$old" ||
    echo "merge of report_${name}_b${b} failed (see above); the run files stand alone"
}
P1=base_sglang/models/proxy-moe
# the schedule files (predictor + layer_budget table) are not committed: rebuild them from the
# committed calibration curves (seconds; `layer_schedule` without --curves re-measures them, 5 min)
sched() {  # out_stem model predictor curves_json
  [ -f "$1.safetensors" ] || python -m base_sglang.calibration.layer_schedule --model "$2" \
    --predictor "$3" --data base_sglang/data/heldout.txt --out "$1" --curves "$4"
}
sched $R/q3/schedule_proxy_upto12 $P1 $P1/predictor.safetensors $R/q3/schedule_proxy.json
sched $R/q3/schedule_proxy2 "$P2DIR" $R/proxy2/predictor.safetensors $R/q3/schedule_proxy2.json
run proxy $P1 $P1/predictor.safetensors $R/q3/schedule_proxy_upto12.safetensors \
  $R/quality_proxy_b8.json 8 8 "4 8 12 16 19 24 32 40 48" "4 8 12"
run proxy $P1 $P1/predictor.safetensors $R/q3/schedule_proxy_upto12.safetensors \
  $R/quality_proxy_b16.json 16 4 "4 8 12 16 24 27 32 40 48" "4 8 12"
run proxy $P1 $P1/predictor.safetensors $R/q3/schedule_proxy_upto12.safetensors \
  $R/quality_proxy_b64.json 64 1 "4 8 12 16 24 32 40 48 52 56 60" "4 8 12"
run proxy2 "$P2DIR" $R/proxy2/predictor.safetensors $R/q3/schedule_proxy2.safetensors \
  $R/proxy2/quality_b8.json 8 8 "2 4 6 8 10 12 16 20 24" "2 4 6"
run proxy2 "$P2DIR" $R/proxy2/predictor.safetensors $R/q3/schedule_proxy2.safetensors \
  $R/proxy2/quality_b16.json 16 4 "2 4 6 8 12 13 16 20 24" "2 4 6"
run proxy2 "$P2DIR" $R/proxy2/predictor.safetensors $R/q3/schedule_proxy2.safetensors \
  $R/proxy2/quality_b64.json 64 1 "2 4 6 8 12 16 20 24 26 28 30" "2 4 6"
