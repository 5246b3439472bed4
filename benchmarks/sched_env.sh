# Shared setup of the issue-13 schedule scripts (sourced, not run; from the repository root).
#   P2DIR  the proxy2 checkpoint (first script argument, default .proxy2/proxy2-moe)
#   R, P1  benchmarks/results and the shipped proxy; C  the report-split base-eval options
#   schedule_table OUT_STEM MODEL PREDICTOR UP_TO CURVES   the table(s) of layer_schedule rebuilt
#          from stored curves (CURVES: one STEM.json, or several comma-separated: one range each),
#          unless OUT_STEM.safetensors exists
set -euo pipefail
export PYTHONUNBUFFERED=1
P2DIR=${1:-.proxy2/proxy2-moe}
R=benchmarks/results
P1=base_sglang/models/proxy-moe
C="--data base_sglang/data/heldout.txt --split report --prefix 64 --steps 64 --no-energy --quiet"
schedule_table() {
  [ -f "$1.safetensors" ] || python -m base_sglang.calibration.layer_schedule --model "$2" \
    --predictor "$3" --data base_sglang/data/heldout.txt --out "$1" --up-to "$4" --curves "$5"
}
