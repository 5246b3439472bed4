#!/usr/bin/env bash
# Issue 13: base_sched with one layer_budget table per batch-size range, on the report split, both
# proxies, B = 8, 16, 64 (CPU, one job at a time).
#   bash benchmarks/run_sched_ranges_cpu.sh [PROXY2_DIR]      (PROXY2_DIR default .proxy2/proxy2-moe)
# The multi-range predictor files are rebuilt (seconds) from the committed calibration curves:
# B = 8 and B = 16 from benchmarks/results/q3/, B = 64 from benchmarks/results/q4/ (ranges rows
# 1-11, 12-32, 33+: geometric midpoints). Per model and B it runs base_sched, oracle_sched with that
# file at the scheduled budgets (k/2, k, 1.5k; above 1.5k the schedule is uniform = base_plus) and
# compares them with the committed q3 rows of base_plus and of base_sched with the single B = 16
# table on the same windows (benchmarks/sched_ranges_table.py). Writes benchmarks/results/q4/.
# The committed q3 runs used transformers 5.17.0: use the same version (the table refuses files
# whose dense NLL differs).
source benchmarks/sched_env.sh "$@"
schedule_table $R/q4/schedule_proxy_ranges $P1 $P1/predictor.safetensors 12 \
  "$R/q3/schedule_proxy_calib_b8.json,$R/q3/schedule_proxy.json,$R/q4/schedule_proxy_calib_b64.json"
schedule_table $R/q4/schedule_proxy2_ranges "$P2DIR" $R/proxy2/predictor.safetensors 6 \
  "$R/q3/schedule_proxy2_calib_b8.json,$R/q3/schedule_proxy2.json,$R/q4/schedule_proxy2_calib_b64.json"
pairs=()
run() {  # name model batch num_batches "budgets"
  local name=$1 model=$2 b=$3 nb=$4 budgets=$5
  base-eval --model "$model" --predictor "$R/q4/schedule_${name}_ranges.safetensors" $C \
    --batch-size "$b" --num-batches "$nb" --budgets $budgets --policies base_sched,oracle_sched \
    --out "$R/q4/report_${name}_b${b}_ranges"
  pairs+=("$R/q3/report_${name}_b${b}.json:$R/q4/report_${name}_b${b}_ranges.json")
}
for spec in "8 8" "16 4" "64 1"; do
  set -- $spec
  run proxy $P1 "$1" "$2" "4 8 12"
  run proxy2 "$P2DIR" "$1" "$2" "2 4 6"
done
python benchmarks/sched_ranges_table.py --out $R/q4/sched_ranges "${pairs[@]}"
