#!/usr/bin/env bash
# The six issue-13 quality runs (two proxies x B = 8, 16, 64, report split), as in BENCHMARKS.md's
# "Quality vs budget", now also writing each run's per-token increases (STEM.tokens.safetensors,
# git-ignored) so that its checks carry paired z (calibration/sweep.py add_paired).
#   bash benchmarks/run_quality_cpu.sh RUN...      RUN in proxy_b8 proxy_b16 proxy_b64 proxy2_b8 ...
#   env: OUT_DIR (default: the committed files' places, benchmarks/results/quality_proxy_bB and
#        benchmarks/results/proxy2_steps/quality_bB; else every run as OUT_DIR/quality_<model>_bB),
#        PROXY2_DIR (.proxy2/proxy2-moe),
#        PY517 (a python with transformers 5.17.0 for the proxy runs, which the committed proxy
#        runs used; default: python), PY (python for proxy2, whose runs used 5.19.0)
# One job per core at most: each run is one torch thread (base-eval sets none; OMP_NUM_THREADS=1).
set -euo pipefail
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
R=benchmarks/results
Q1=${OUT_DIR:-$R}  # proxy runs: $Q1/quality_proxy_bB
Q2=${OUT_DIR:-$R/proxy2_steps}  # proxy2 runs: $Q2/quality_bB (or OUT_DIR/quality_proxy2_bB)
N2=$([ -n "${OUT_DIR:-}" ] && echo quality_proxy2 || echo quality)
P2DIR=${PROXY2_DIR:-.proxy2/proxy2-moe}
PY517=${PY517:-python}
PY=${PY:-python}
RUNS="proxy_b8 proxy_b16 proxy_b64 proxy2_b8 proxy2_b16 proxy2_b64"
for run in "$@"; do  # every name checked before anything runs
  case " $RUNS " in *" $run "*) ;; *) echo "run_quality_cpu.sh: unknown run '$run' ($RUNS)" >&2; exit 2 ;; esac
done
mkdir -p "$Q1" "$Q2"
C="--data base_sglang/data/heldout.txt --split report --prefix 64 --steps 64 --no-energy \
--max-errors 0.02 0.05 0.1 0.2 0.4 0.6 --quiet"
P1="--model base_sglang/models/proxy-moe --predictor base_sglang/models/proxy-moe/predictor.safetensors"
P2="--model $P2DIR --predictor benchmarks/results/proxy2_steps/predictor.safetensors"
for run in "$@"; do
  case $run in
    proxy_b8) $PY517 -m base_sglang.calibration.eval $P1 $C --batch-size 8 --num-batches 8 --out "$Q1/quality_proxy_b8" ;;
    proxy_b16) $PY517 -m base_sglang.calibration.eval $P1 $C --batch-size 16 --num-batches 4 --out "$Q1/quality_proxy_b16" ;;
    proxy_b64) $PY517 -m base_sglang.calibration.eval $P1 $C --batch-size 64 --num-batches 1 \
                 --budgets 4 8 12 16 24 32 40 48 52 56 60 --out "$Q1/quality_proxy_b64" ;;
    proxy2_b8) $PY -m base_sglang.calibration.eval $P2 $C --batch-size 8 --num-batches 8 --out "$Q2/${N2}_b8" ;;
    proxy2_b16) $PY -m base_sglang.calibration.eval $P2 $C --batch-size 16 --num-batches 4 --out "$Q2/${N2}_b16" ;;
    proxy2_b64) $PY -m base_sglang.calibration.eval $P2 $C --batch-size 64 --num-batches 1 \
                  --budgets 2 4 6 8 12 16 20 24 26 28 30 --out "$Q2/${N2}_b64" ;;
  esac
done
