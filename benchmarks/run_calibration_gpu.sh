#!/usr/bin/env bash
# base-calibrate and base-eval on a CUDA machine: the CUDA path of calibration against the shipped
# (CPU-fitted) predictor, and a batch-128 quality sweep that is slow on CPU.
# Usage: BASE_COMMIT=$(git rev-parse --short HEAD) benchmarks/run_calibration_gpu.sh [OUT_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-benchmarks/results/calibration_h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || exit 1
MODEL=base_sglang/models/proxy-moe
DATA=base_sglang/data/heldout.txt
START=$SECONDS
base-calibrate --model $MODEL --data $DATA --out "$OUT/predictor_cuda.safetensors" --device cuda \
    --dtype float32 --quiet 2>&1 | tail -5 | tee "$OUT/calibrate.log"
echo "calibration wall $((SECONDS - START)) s" | tee -a "$OUT/calibrate.log"
python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/compare.log"
import json, sys, torch
from base_sglang.core import Predictor
out = sys.argv[1]
cpu = Predictor.load("base_sglang/models/proxy-moe/predictor.safetensors")
gpu = Predictor.load(f"{out}/predictor_cuda.safetensors")
rows = {}
for layer in cpu.meta.moe_layers:
    j = cpu.slot(layer)
    rel = float((gpu.weight[j] - cpu.weight[j]).norm() / cpu.weight[j].norm())
    sc, sg = cpu.meta.fit_stats[str(layer)], gpu.meta.fit_stats[str(layer)]
    rows[layer] = {"weight_rel_diff": rel, **{f"cpu_{k}": sc[k] for k in sc if "spearman" in k or "r2" in k},
                   **{f"cuda_{k}": sg[k] for k in sg if "spearman" in k or "r2" in k}}
    print(layer, json.dumps(rows[layer]))
json.dump(rows, open(f"{out}/compare.json", "w"), indent=1)
PY
base-eval --model $MODEL --predictor $MODEL/predictor.safetensors --data $DATA --device cuda \
    --dtype float32 --batch-size 128 --num-batches 1 --prefix 64 --steps 32 \
    --policies base,oracle,gate_sum,exfold,oea --out "$OUT/quality_proxy_b128" --quiet 2>&1 | tail -40 | tee "$OUT/eval_b128.log"
