#!/usr/bin/env bash
# First device call with real SGLang + BASE on one H200 (< 9 min). From the repository root:
#
#   OUT=... bash benchmarks/gpu/smoke_sglang.sh            (carry: .device_carry; keep the proxy
#                                                            weights home: ../shared/tools/device-slim)
# 1. installs the offline bundle .device_carry/sglang-*-cp312.tar.xz (install_bundle.sh: unpack,
#    register this checkout as SGLang plugin `base`, check versions + the import chain);
# 2. writes a synthetic BASE predictor for the Qwen3-30B-A3B shape (base_sglang.core.Predictor,
#    random weights: a speed test, not a quality one) and checks that sglang's load_plugins()
#    applies every BASE hook with BASE_PREDICTOR set and that the predictor fits the config;
# 3. sglang.bench_one_batch on benchmarks/gpu/qwen3-30b-a3b (dummy weights, CUDA graphs), B=16,
#    input 256, output 32, Triton attention + Triton MoE: once with the plugin loaded
#    (run_with_plugins.py, BASE_DEFAULT_BUDGET=16) and once plain (plugin off);
# 4. prints decode tok/s of each (+ BASE's experts executed per MoE layer and the dense union).
# Writes under $OUT (default benchmarks/results/sglang_smoke): env.txt, install.log, plugin.log,
# bench_base16.log, bench_off.log, bench.jsonl (bench_one_batch's own results), summary.json.
# Every step is bounded by `timeout` inside one overall deadline; a failed step does not stop the
# steps after it (the summary says which failed).
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/results/sglang_smoke}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
DEST=${SGL_BUNDLE_DEST:-/tmp/sgl-bundle}
MODEL=benchmarks/gpu/qwen3-30b-a3b
BUDGET=${SMOKE_BUDGET:-16}
deadline=$((SECONDS + ${SMOKE_SECONDS:-520}))  # 8 min 40 s of work, whatever the steps take
shopt -s nullglob
bundles=(.device_carry/sglang-*-cp312.tar.xz)
shopt -u nullglob
[ ${#bundles[@]} -ge 1 ] || { echo "no .device_carry/sglang-*-cp312.tar.xz: build it with" \
    "benchmarks/gpu/build_bundle.sh and carry .device_carry" >&2; exit 2; }
BUNDLE=${SGL_BUNDLE:-${bundles[-1]}}

declare -A RC SECS
# step NAME LIMIT CMD...: run CMD under timeout (the smaller of LIMIT and what the deadline leaves),
# output to $OUT/NAME.log and the console; never stops the script
step() {
    local name=$1 limit=$2; shift 2
    local left=$((deadline - SECONDS - 5))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then
        echo "== $name: skipped, the deadline is near" | tee "$OUT/$name.log"
        RC[$name]=skipped; SECS[$name]=0; return 0
    fi
    echo "== $name (limit ${limit} s)"
    local t0=$SECONDS rc
    set +e
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    RC[$name]=$rc; SECS[$name]=$((SECONDS - t0))
    [ "$rc" = 124 ] && echo "== $name: TIMED OUT after ${limit} s" | tee -a "$OUT/$name.log"
    [ "$rc" = 0 ] || echo "== $name: exit $rc"
    return 0
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
      || echo "no nvidia-smi"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "bundle $BUNDLE ($(stat -c %s "$BUNDLE") bytes)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

step install 150 bash benchmarks/gpu/install_bundle.sh "$BUNDLE" "$DEST"
if [ ! -f "$DEST/env.sh" ]; then
    echo "the bundle did not install: see $OUT/install.log"; exit 1
fi
# a failed check (listed in install.log) still leaves a usable install: go on, the summary says so
[ "${RC[install]}" = 0 ] || echo "== the bundle check failed (see install.log); running the rest anyway"
# shellcheck disable=SC1091
source "$DEST/env.sh"

PRED=/tmp/base-smoke/predictor-qwen3-30b-a3b.safetensors
mkdir -p "$(dirname "$PRED")"
export BASE_PREDICTOR=$PRED BASE_DEFAULT_BUDGET=$BUDGET BASE_STATS_INTERVAL=8
step plugin 120 python3 - "$MODEL" "$PRED" <<'EOF'
"""Synthetic predictor for the model dir's shape, then sglang's load_plugins() with BASE on."""
import json
import os
import sys

import torch

from base_sglang.core import Predictor, PredictorMeta

model_dir, path = sys.argv[1], sys.argv[2]
cfg = json.load(open(f"{model_dir}/config.json"))
L, E, H = cfg["num_hidden_layers"], cfg["num_experts"], cfg["hidden_size"]
g = torch.Generator().manual_seed(0)
meta = PredictorMeta(architecture=cfg["architectures"][0], model_id="synthetic-qwen3-30b-a3b",
                     num_layers=L, moe_layers=list(range(L)), hidden_size=H, num_experts=E,
                     top_k=cfg["num_experts_per_tok"], norm_topk_prob=cfg["norm_topk_prob"],
                     calibration={"synthetic": "random weights: a speed test, not a quality one"})
Predictor(meta=meta, weight=torch.randn(L, E, H, generator=g) * 0.02,
          bias=torch.randn(L, E, generator=g) * 0.1).save(path)
print(f"predictor {path}: L={L} E={E} H={H} top-{meta.top_k}")

import sglang
from sglang.srt.plugins import hook_registry, load_plugins
from transformers import AutoConfig

from base_sglang.plugin import TARGETS, state

Predictor.load(path).validate(AutoConfig.from_pretrained(model_dir).get_text_config())
load_plugins()
cfg = state.STATE.config
assert state.STATE.config_error is None, state.STATE.config_error
assert cfg.enabled and cfg.predictor == path, cfg
assert cfg.default_budget == int(os.environ["BASE_DEFAULT_BUDGET"]), cfg
patched = hook_registry.HookRegistry._patched
missing = [t for t, _, _ in TARGETS if t not in patched]
print(f"sglang {sglang.__version__}: load_plugins() applied {len(TARGETS) - len(missing)} of "
      f"{len(TARGETS)} BASE hooks; BASE on (budget {cfg.default_budget}, policy {cfg.policy})")
if missing:
    sys.exit("hooks NOT applied: " + ", ".join(missing))
EOF

bench=(--model-path "$MODEL" --load-format dummy --batch-size 16 --input-len 256 --output-len 32
       --attention-backend triton --sampling-backend pytorch --grammar-backend xgrammar
       --moe-runner-backend triton --mem-fraction-static 0.7 --result-filename "$OUT/bench.jsonl")
rm -f "$OUT/bench.jsonl"
step bench_base16 240 python3 benchmarks/gpu/run_with_plugins.py sglang.bench_one_batch "${bench[@]}" \
    --run-name "base$BUDGET"
step bench_off 200 env -u BASE_PREDICTOR python3 -m sglang.bench_one_batch "${bench[@]}" --run-name off

python3 - "$OUT" "$BUDGET" "${RC[install]}:${SECS[install]}" "${RC[plugin]}:${SECS[plugin]}" \
    "${RC[bench_base16]}:${SECS[bench_base16]}" "${RC[bench_off]}:${SECS[bench_off]}" <<'EOF'
import json
import re
import sys
from pathlib import Path

out, budget = Path(sys.argv[1]), sys.argv[2]
steps = dict(zip(("install", "plugin", "bench_base16", "bench_off"),
                 ({"rc": int(rc) if rc.isdigit() else rc, "seconds": int(sec)}
                  for rc, sec in (s.split(":") for s in sys.argv[3:]))))
results = {}
if (out / "bench.jsonl").exists():
    for line in (out / "bench.jsonl").read_text().splitlines():
        row = json.loads(line)
        results[row.get("run_name")] = row
stats = {}
text = (out / "bench_base16.log").read_text(errors="replace") if (out / "bench_base16.log").exists() else ""
for m in re.finditer(r"experts executed per MoE layer per step: mean ([\d.]+) \(dense union ([\d.]+)\)", text):
    stats = {"experts_per_layer": float(m[1]), "union_dense": float(m[2])}  # the last interval
gpu = (out / "env.txt").read_text().splitlines()[0] if (out / "env.txt").exists() else "?"
rows = []
for name, run in ((f"base{budget}", "bench_base16"), ("off", "bench_off")):
    r = results.get(name, {})
    rows.append({"run": name, "step_rc": steps[run]["rc"], "seconds": steps[run]["seconds"],
                 "decode_tok_s": r.get("median_decode_throughput"),
                 "prefill_tok_s": r.get("prefill_throughput"),
                 **(stats if name != "off" else {})})
env = (out / "env.txt").read_text().splitlines() if (out / "env.txt").exists() else []
commit = next((line.split()[1] for line in env if line.startswith("commit ")), None)
summary = {"gpu": gpu, "commit": commit, "batch": 16, "input_len": 256, "output_len": 32, "budget": budget,
           "steps": steps, "rows": rows}
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
print(f"\n{'step':<14} {'rc':>7} {'s':>5}")
for name, s in steps.items():
    print(f"{name:<14} {s['rc']:>7} {s['seconds']:>5}")
print(f"\n{'run':<8} {'decode tok/s':>13} {'prefill tok/s':>14} {'experts/layer':>14} {'union':>7}")
fmt = lambda v, f: format(v, f) if isinstance(v, (int, float)) else format("-", ">" + f.split(".")[0])
for r in rows:
    print(f"{r['run']:<8} {fmt(r['decode_tok_s'], '13.1f')} {fmt(r['prefill_tok_s'], '14.1f')} "
          f"{fmt(r.get('experts_per_layer'), '14.2f')} {fmt(r.get('union_dense'), '7.2f')}")
base, off = (rows[0]["decode_tok_s"], rows[1]["decode_tok_s"])
if base and off:
    print(f"BASE budget {budget} / plugin off: {base / off:.3f}x decode throughput")
EOF
