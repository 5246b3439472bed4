#!/usr/bin/env bash
# Train the second proxy MoE in one device call (<= 10 minutes): Qwen3-MoE, hidden 256, 6 layers,
# 32 experts, top-4, expert intermediate 128, norm_topk_prob FALSE (config E32K4 of
# research/proxy/train.py; proxy_model.md section 0 measured this config at 2.26M tokens/s).
#
# Run from the repository root on the CUDA machine, carrying the pre-tokenized corpus (built on a
# CPU machine, ~38 MB; the shipped proxy weights are NOT needed and may stay home):
#     python -m research.proxy.build_corpus --work .corpus
#     python -m research.proxy.train_tokenizer --work .corpus --tokenizer base_sglang/models/proxy-moe
#     carry: .corpus/train.u16.xz .corpus/val.u16 .corpus/index.json .corpus/tokenizer
#     bash benchmarks/gpu/train_proxy2.sh            # writes under $OUT (default /tmp/proxy2_out)
#
# $OUT afterwards (<= 6 files, each < 16 MiB): model.tar.part-00..02 (cat model.tar.part-* | tar -x
# gives proxy2-moe/), metrics.json (loss history, held-out CE, routing statistics, union curve),
# log.txt, install.log. Prints a short table at the end.
set -euo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-${1:-/tmp/proxy2_out}}
mkdir -p "$OUT"
STEPS=${PROXY2_STEPS:-7000}       # the LR schedule runs over these steps (--schedule steps): the
                                  # same run on any H200 (~49 ms per step: 343 s; 7,344 fitted in 360 s)
BUDGET=${PROXY2_BUDGET:-430}      # seconds of optimisation: only a safety stop (metrics.json says
                                  # schedule_done false if it cut the schedule short)
DEADLINE=${PROXY2_DEADLINE:-530}  # seconds from process start to be done by (eval + save + pack inside)
# PROXY2_ARGS: extra train.py flags, only for a CPU smoke run of this script (e.g. "--steps 2 --batch 2")
T0=$SECONDS

for f in .corpus/train.u16.xz .corpus/val.u16 .corpus/index.json .corpus/tokenizer/tokenizer.json; do
    if [ ! -f "$f" ]; then echo "missing $f: carry .corpus (see the header of this script)"; exit 2; fi
done

# base_sglang.calibration lives in calibration/ (pyproject package-dir): install the tree, or, if pip
# cannot, lay the same package out with symlinks.
if timeout 90 python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1; then
    echo "installed base-sglang (editable) in $((SECONDS - T0)) s"
else
    echo "pip install failed (see install.log); using a symlinked package tree" | tee -a "$OUT/install.log"
    SHIM=$(mktemp -d)/pkg
    mkdir -p "$SHIM/base_sglang"
    for x in base_sglang/*; do ln -s "$PWD/$x" "$SHIM/base_sglang/$(basename "$x")"; done
    ln -s "$PWD/calibration" "$SHIM/base_sglang/calibration"
    ln -s "$PWD/kernels" "$SHIM/base_sglang/kernels"
    ln -s "$PWD/server" "$SHIM/base_sglang/server"
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 -c "import research.proxy.train as t; print('train.py from', t.__file__)"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

rm -rf /tmp/proxy2-moe
LEFT=$((590 - (SECONDS - T0)))         # the whole call stays under 10 minutes
if [ "$DEADLINE" -gt $((LEFT - 20)) ]; then DEADLINE=$((LEFT - 20)); fi
echo "training: budget $BUDGET s, deadline $DEADLINE s, hard limit $LEFT s"
set +e
timeout "$LEFT" python3 -m research.proxy.train --data .corpus --config E32K4 \
    --out /tmp/proxy2-moe --steps "$STEPS" --schedule steps --budget "$BUDGET" --deadline "$DEADLINE" \
    --pack-to "$OUT" \
    ${PROXY2_ARGS:-} 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
set -e
echo "train.py exit $rc after $((SECONDS - T0)) s"
ls -la "$OUT"
if [ ! -f "$OUT/metrics.json" ]; then
    echo "no metrics.json: training did not finish (see log.txt)"; exit 1
fi
python3 - "$OUT/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(f"\n== proxy2 (E32K4): {m.get('params_total', 0) / 1e6:.2f}M params, {m.get('params_active', 0) / 1e6:.2f}M active,"
      f" {m.get('steps')} steps (schedule {m.get('schedule')}, done {m.get('schedule_done')}), {m.get('tokens', 0) / 1e6:.0f}M tokens in {m.get('train_s')} s,"
      f" {m.get('tokens_per_s', 0) / 1e6:.2f}M tok/s, torch {m.get('torch')}, transformers {m.get('transformers')}")
if "heldout_ce" in m:
    print(f"held-out CE {m['heldout_ce']:.4f} nats, ppl {m['heldout_ppl']:.2f} on {m['heldout_tokens']} tokens")
    u = m["union"]
    print(f"{'layer':>5} {'max/mean':>8} {'min/mean':>8} {'dead':>4} {'entropy':>7} {'MI':>6} {'union@16':>8}")
    for i, lay in enumerate(m["routing"]["layers"]):
        print(f"{i:5d} {lay['load_max_over_mean']:8.2f} {lay['load_min_over_mean']:8.2f} {lay['dead_experts']:4d} "
              f"{lay['load_entropy']:7.3f} {lay['mutual_info']:6.3f} {u['per_layer']['16'][i]:8.1f}")
    print("union mean: " + ", ".join(f"B={b}: {u['mean'][str(b)]:.1f} (uniform {u['uniform'][str(b)]:.1f})"
                                     for b in u["batch_sizes"]))
else:
    print("evaluation error:", m.get("eval_error"))
for s in m.get("samples", []):
    print("sample:", repr(s[:160]))
PY
