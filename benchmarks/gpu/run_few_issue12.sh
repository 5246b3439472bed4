#!/usr/bin/env bash
# Issue 12, thirtieth session, call 2: moe_one down_cols_few (narrow down units when they all fit the
# grid) against the shipped rows, twice; TMA rows with d=64 (narrow tiles by pointer loads), t=0,
# t=0/d=64; OLMoE T = 16; H200: split T = 1-4.
#   OUT=DIR BASE_COMMIT=sha bash benchmarks/gpu/run_few_issue12.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "gpu: $gpu" | tee $OUT/gpu.txt
source benchmarks/gpu_env.sh; kernel_run_env "$OUT"
T=benchmarks/gpu/trace_moe_one.py
for rep in 1 2; do
  mkdir -p $OUT/q16_$rep $OUT/o16_$rep $OUT/tma_$rep
  timeout 115 python3 $T --out $OUT/q16_$rep --shapes qwen3-30b-a3b --tokens 16 --budgets 4,6,8,10,12,16 \
     --variants shipped,d=64,dn=64:64,d=32 --trace-only d=64 --budget-s 100 > $OUT/q16_$rep/log 2>&1
  grep -v "^ " $OUT/q16_$rep/log | cut -c1-150 | tail -28
  timeout 90 python3 $T --out $OUT/tma_$rep --shapes qwen3-30b-a3b --tokens 4,8,32 --budgets 6,8,10,16 \
     --variants shipped,d=64,t=0,t=0/d=64 --trace-only none --budget-s 75 > $OUT/tma_$rep/log 2>&1
  cut -c1-110 $OUT/tma_$rep/log | tail -40
  timeout 50 python3 $T --out $OUT/o16_$rep --shapes olmoe-1b-7b --tokens 16 --budgets 8,16 \
     --variants shipped,d=64 --trace-only none --budget-s 40 > $OUT/o16_$rep/log 2>&1
  cut -c1-110 $OUT/o16_$rep/log | tail -6
done
case "$gpu" in *H200*) OUT=$OUT/splitsweep PARTS=splitsweep SPLIT_T=1,2,4 SPLITSWEEP_S=100 bash benchmarks/gpu/run_route_h200.sh ;; esac
