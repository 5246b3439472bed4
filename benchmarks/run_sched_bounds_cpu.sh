#!/usr/bin/env bash
# Issue 13, range bounds of the multi-range schedule: at B = 32 (the last row count of the B = 16
# range) and B = 48 (inside the B = 64 range), base_plus and base_sched with the single B = 16 table
# against base_sched with the single B = 64 table, report split, both proxies (CPU, one job at a time).
#   bash benchmarks/run_sched_bounds_cpu.sh [PROXY2_DIR]      (PROXY2_DIR default .proxy2/proxy2-moe)
# Tables are rebuilt from the committed curves (seconds) into benchmarks/results/q4/ (the q3 records
# stay as they are). Writes benchmarks/results/q4/bounds_*.
source benchmarks/sched_env.sh "$@"
schedule_table $R/q4/schedule_proxy_b16 $P1 $P1/predictor.safetensors 12 $R/q3/schedule_proxy.json
schedule_table $R/q4/schedule_proxy_calib_b64 $P1 $P1/predictor.safetensors 12 $R/q4/schedule_proxy_calib_b64.json
schedule_table $R/q4/schedule_proxy2_b16 "$P2DIR" $R/proxy2/predictor.safetensors 6 $R/q3/schedule_proxy2.json
schedule_table $R/q4/schedule_proxy2_calib_b64 "$P2DIR" $R/proxy2/predictor.safetensors 6 \
  $R/q4/schedule_proxy2_calib_b64.json
pairs=()
run() {  # name model b16_table b64_table batch num_batches "budgets"
  local name=$1 model=$2 t16=$3 t64=$4 b=$5 nb=$6 budgets=$7
  base-eval --model "$model" --predictor "$t16.safetensors" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $budgets --policies base_plus,base_sched --out "$R/q4/bounds_${name}_b${b}_b16table"
  base-eval --model "$model" --predictor "$t64.safetensors" $C --batch-size "$b" --num-batches "$nb" \
    --budgets $budgets --policies base_sched --out "$R/q4/bounds_${name}_b${b}_b64table"
  pairs+=("$R/q4/bounds_${name}_b${b}_b16table.json:$R/q4/bounds_${name}_b${b}_b64table.json")
}
for spec in "32 2" "48 1"; do
  set -- $spec
  run proxy $P1 $R/q4/schedule_proxy_b16 $R/q4/schedule_proxy_calib_b64 "$1" "$2" "8 12"
  run proxy2 "$P2DIR" $R/q4/schedule_proxy2_b16 $R/q4/schedule_proxy2_calib_b64 "$1" "$2" "4 6"
done
python benchmarks/sched_ranges_table.py --label "B=64 table" --out $R/q4/sched_bounds "${pairs[@]}"
