#!/usr/bin/env bash
# Issue 12 on one H200, one device call (< 9 min): fused_moe's launch structures and tiles.
#   1. check_kernels_gpu.py --only moe [CHECK_ARGS, e.g. --moe-paths one,one2]: every structure
#      == the fp32 reference at three shapes, graph replays == eager, two streams, base_sched in both
#      selection kernels                                             -> OUT/checks.json, check_moe.log
#   2. tests/kernels on CUDA, or PYTEST_PATHS (and the base_score strided test alone), PYTEST_S seconds
#      (default 150); with .device_carry/wheels carried (pytest-xdist, execnet), PYTEST_N workers (14):
#      the whole folder then takes about 70 s (get them with `pip download --no-deps -d
#      .device_carry/wheels pytest-xdist==3.8.0 execnet==2.1.2`, carry .device_carry/wheels) -> OUT/pytest.log
#   checkall (only when named): every check_kernels_gpu.py group (default, moe, route, compact, split)
#      at once, one process per (group, shape) (CHECKALL_GROUPS "group:shape ..."), CHECKALL_S seconds
#      each (480); PASS/FAIL counted from each log                       -> OUT/all/*.log, summary.txt
#   3. gpu/sweep_moe.py: grouped / pair-major / one-launch per (shape, T, routing), then a tile
#      search on the fastest (SWEEP_SHAPES, SWEEP_T, SWEEP_TILE_T, SWEEP_S) -> OUT/sweep_moe.json, sweep.log
#   4. bench_fused_moe.py at T = 1, 8 (Qwen3) with SGLang's Triton align timed -> OUT/fused_moe.{csv,json}
#   extend (only when named): sweep EXTEND_T (default 4,128), merge it with EXTEND_BASE (earlier
#      sweep files) into kernels/configs/NVIDIA_H200.json, bench those T with it -> OUT/
#   cudaalign (only when named; carry .whl/sglang-0.5.23-moe.tar.gz and
#      .device_carry/sglang-0.5.17-cp312.tar.xz, the wheel and the bundle exceed 64 MiB together): the dense
#      layer at T = 8..64, three shapes, SGLang timed with sgl_kernel's CUDA align inside
#      (sglang_cuda_align_us), and the dense table against it              -> OUT/fused_moe.{csv,json}
#   profile (only when named): gpu/profile_moe.py, per-kernel GPU time of selection + fused_moe
#      in a CUDA graph, and the time between kernels                      -> OUT/profile_moe.json
#   hook (only when named; carry .device_carry/sglang-0.5.17-cp312.tar.xz): gpu/check_moe_hook.py,
#      the plugin's fused_experts hook (BASE_MOE=auto) against SGLang's own fused_experts_impl
#      for BASE-selected ids, Qwen3 / OLMoE, T = 1..17, 64, 65, graphs -> OUT/moe_hook.json, hook.log
#   densetune (only when named; carry .whl/sglang-0.5.23-moe.tar.gz): the one-launch tile search on
#      dense routing at DENSE_T (default 32), Qwen3, merged --keep-faster into
#      kernels/configs/NVIDIA_H200.json, then bench_fused_moe.py --no-tune at DENSE_BENCH_T
#      (default 16,32,64)           -> OUT/dense/sweep_moe.json, NVIDIA_H200.json, fused_moe.{csv,json}
#   grouptune (only when named; carry .whl/sglang-0.5.23-moe.tar.gz and .device_carry/sglang-0.5.17-cp312.tar.xz):
#      the grouped tile search on dense routing at GT_T (default 32,64), GT_SHAPES (Qwen3), a table
#      with those rows replaced (tuned_configs.py --replace over the shipped table's own provenance),
#      then GT_ROUNDS (3) rounds of bench_fused_moe.py --no-tune --dense-only with the shipped table
#      and the new one in turn, SGLang with its CUDA align inside each run
#                    -> OUT/g/sweep_moe.json, OUT/table_{old,new}.json, OUT/ab_{old,new}_R/, ab.json
#   densegrid (only when named; carry the wheel tarball and the bundle as for cudaalign): DG_ROUNDS (3)
#      rounds of bench_fused_moe.py --no-tune --dense-only, three shapes, T = DG_T (1..64), the shipped
#      table, SGLang with its CUDA align inside each run, DG_S seconds a round; medians over rounds;
#      DG_SHAPES narrows the shapes; DG_NEW_ENV="VAR=value ..." adds the same run under those settings
#      to each round (OUT/ab_new_R: e.g. BASE_MOE_ALIGN=sort)
#                                                           -> OUT/ab_old_R/fused_moe.json, OUT/ab.json
#   trace (only when named): gpu/trace_moe_one.py, the one-launch layer's in-kernel timeline
#      (%globaltimer per unit) with the shipped tiles or variants of them, timed and checked
#      (TRACE_SHAPES, TRACE_T, TRACE_M, TRACE_VARIANTS, TRACE_ONLY, TRACE_S) -> OUT/trace_moe_one.json
#   full (only when named in PARTS): bench_fused_moe.py --no-tune (the shipped defaults: the tuned
#      rows of kernels/configs), three shapes, T in 1..128, SGLang timed   -> OUT/fused_moe.{csv,json}
# Usage (repository root, carry .whl/ with the sglang 0.5.23 wheel for part 4, proxy weights home):
#   OUT=/path [BASE_COMMIT=sha] [PARTS="check pytest sweep bench"] bash benchmarks/gpu/run_moe_h200.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu_env.sh
kernel_run_env benchmarks/results/kernels_h200_moe
PARTS=${PARTS:-check pytest sweep bench}
status=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for part in $PARTS; do
    case "$part" in
        check) echo "=== checks"
            timeout -k 10 ${CHECK_S:-120} python3 benchmarks/check_kernels_gpu.py --only moe --out "$OUT" ${CHECK_ARGS:-} \
                > "$OUT/check_moe.log" 2>&1 || status=1
            grep -E "FAIL|checks passed" "$OUT/check_moe.log" | cut -c1-200 | tail -12 ;;
        checkall) echo "=== every check_kernels_gpu.py group at once, a process per (group, shape)"
            mkdir -p "$OUT/all"
            for g in ${CHECKALL_GROUPS:-default:qwen3-30b-a3b default:olmoe-1b-7b default:mixtral-8x7b \
                     moe:qwen3-30b-a3b moe:olmoe-1b-7b moe:mixtral-8x7b route:qwen3-30b-a3b route:olmoe-1b-7b \
                     route:mixtral-8x7b compact: split:qwen3-30b-a3b split:olmoe-1b-7b split:mixtral-8x7b}; do
                only=${g%%:*}; shape=${g#*:}; args=""
                [ "$only" != default ] && args="--only $only"
                [ -n "$shape" ] && args="$args --shapes $shape"
                timeout -k 10 ${CHECKALL_S:-480} python3 benchmarks/check_kernels_gpu.py $args \
                    --out "$OUT/all/${only}_${shape:-all}" > "$OUT/all/${only}_${shape:-all}.log" 2>&1 &
            done
            wait
            for f in "$OUT"/all/*.log; do  # a killed process writes no checks.json: count its printed lines
                printf "%-28s %4s passed %3s failed %s\n" "$(basename "$f" .log)" "$(grep -c '^PASS' "$f")" \
                    "$(grep -c '^FAIL' "$f")" "$(grep -q 'checks passed' "$f" && echo done || echo 'NOT FINISHED')"
            done | tee "$OUT/all/summary.txt"
            grep -h '^FAIL' "$OUT"/all/*.log | cut -c1-200 | head -20
            ! grep -q -E 'NOT FINISHED| [1-9][0-9]* failed' "$OUT/all/summary.txt" || status=1 ;;
        pytest) echo "=== tests/kernels on CUDA"
            xdist=""
            if ls .device_carry/wheels/pytest_xdist-*.whl >/dev/null 2>&1; then  # the device has pytest, not xdist
                pip install -q --no-deps --no-index .device_carry/wheels/*.whl > "$OUT/xdist.log" 2>&1 \
                    && xdist="-n ${PYTEST_N:-14}"
            fi
            (cd "${PKG:-$ROOT}" && timeout -k 10 ${PYTEST_S:-150} python3 -m pytest -q -rfE -p no:cacheprovider \
                --rootdir="$ROOT" -c "$ROOT/pyproject.toml" $xdist ${PYTEST_PATHS:-$ROOT/tests/kernels} \
                > "$OUT/pytest.log" 2>&1) || status=1
            (cd "${PKG:-$ROOT}" && timeout -k 10 40 python3 -m pytest -q -x -p no:cacheprovider \
                --rootdir="$ROOT" -c "$ROOT/pyproject.toml" \
                "$ROOT/tests/kernels/test_base_score.py::test_strided_hidden_rows" 2>&1 \
                | tail -60 >> "$OUT/pytest.log")
            grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -8 ;;
        sweep) echo "=== launch structures and tiles"
            timeout -k 10 $(( ${SWEEP_S:-320} + 30 )) python3 benchmarks/gpu/sweep_moe.py --out "$OUT" \
                --budget-s ${SWEEP_S:-320} --shapes ${SWEEP_SHAPES:-qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b} \
                --tokens ${SWEEP_T:-1,2,8,16,32,64} --tile-tokens ${SWEEP_TILE_T:-1,2,8,16,32,64} \
                ${SWEEP_ARGS:-} \
                > "$OUT/sweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/sweep.log" | cut -c1-230 | tail -45 ;;
        bench) echo "=== MoE layer at T = 1, 8 (Qwen3) with SGLang's align timed"
            unpack_sglang_wheel
            timeout -k 10 80 python3 benchmarks/bench_fused_moe.py --out "$OUT" --sglang-root /tmp/sglang_whl \
                --shapes qwen3-30b-a3b --tokens 1,8 > "$OUT/bench_fused_moe.log" 2>&1 || status=1
            tail -16 "$OUT/bench_fused_moe.log" ;;
        trace) echo "=== one-launch timeline"
            timeout -k 10 ${TRACE_S:-240} python3 benchmarks/gpu/trace_moe_one.py --out "$OUT" \
                --shapes ${TRACE_SHAPES:-qwen3-30b-a3b,olmoe-1b-7b} --tokens ${TRACE_T:-8,16,32} \
                --budgets ${TRACE_M:-8,16} --variants ${TRACE_VARIANTS:-shipped} --trace-only "${TRACE_ONLY:-}" \
                --budget-s $(( ${TRACE_S:-240} - 30 )) > "$OUT/trace.log" 2>&1 || status=1
            grep -v -i warn "$OUT/trace.log" | cut -c1-160 | tail -40 ;;
        full) echo "=== MoE layer, shipped defaults (--no-tune), three shapes, T <= 128, SGLang"
            unpack_sglang_wheel
            timeout -k 10 ${FULL_S:-330} python3 benchmarks/bench_fused_moe.py --out "$OUT" --no-tune \
                --sglang-root /tmp/sglang_whl --tokens ${FULL_T:-1,2,8,16,32,64,128} \
                > "$OUT/bench_fused_moe.log" 2>&1 || status=1
            grep -v -i warn "$OUT/bench_fused_moe.log" | tail -90 | cut -c1-120 ;;
        extend) echo "=== extend the tuned table: sweep T = ${EXTEND_T:-4,128}, merge, re-bench those T"
            timeout -k 10 ${EXTEND_S:-270} python3 benchmarks/gpu/sweep_moe.py --out "$OUT" \
                --budget-s $(( ${EXTEND_S:-270} - 30 )) --tokens "${EXTEND_T:-4,128}" \
                --tile-tokens "${EXTEND_T:-4,128}" > "$OUT/sweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/sweep.log" | cut -c1-230 | tail -14
            python3 benchmarks/gpu/tuned_configs.py ${EXTEND_BASE:-} "$OUT/sweep_moe.json" && \
                cp kernels/configs/NVIDIA_H200.json "$OUT/" || status=1
            unpack_sglang_wheel
            timeout -k 10 ${FULL_S:-150} python3 benchmarks/bench_fused_moe.py --out "$OUT" --no-tune \
                --sglang-root /tmp/sglang_whl --tokens "${EXTEND_T:-4,128}" \
                > "$OUT/bench_fused_moe.log" 2>&1 || status=1
            grep -v -i warn "$OUT/bench_fused_moe.log" | tail -40 | cut -c1-120 ;;
        hook) echo "=== the plugin's MoE hook against SGLang's fused_experts_impl"
            source benchmarks/gpu/lib.sh
            sgl_setup > "$OUT/hook.log" 2>&1 || status=1
            timeout -k 10 ${HOOK_S:-150} bash benchmarks/gpu/sgl_exec.sh python3 \
                benchmarks/gpu/check_moe_hook.py --out "$OUT" ${HOOK_ARGS:-} >> "$OUT/hook.log" 2>&1 || status=1
            grep -E "^\||hook checks|Error" "$OUT/hook.log" | cut -c1-160 | tail -16 ;;
        densetune) echo "=== one-launch tiles on dense routing at T = ${DENSE_T:-32}, merged, re-benched"
            timeout -k 10 $(( ${DENSE_S:-150} + 30 )) python3 benchmarks/gpu/sweep_moe.py --out "$OUT/dense" \
                --budget-s ${DENSE_S:-150} --structure one --routings dense --shapes qwen3-30b-a3b \
                --tokens ${DENSE_T:-32} --tile-tokens ${DENSE_T:-32} > "$OUT/sweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/sweep.log" | cut -c1-230 | tail -4
            python3 benchmarks/gpu/tuned_configs.py --keep-faster \
                benchmarks/results/kernels_h200_moe/call{2,4}/sweep_moe.json \
                benchmarks/results/kernels_h200_one/call{2,3/budget,3/dense}/sweep_moe.json \
                "$OUT/dense/sweep_moe.json" && cp kernels/configs/NVIDIA_H200.json "$OUT/" || status=1
            unpack_sglang_wheel
            timeout -k 10 ${FULL_S:-120} python3 benchmarks/bench_fused_moe.py --out "$OUT" --no-tune \
                --sglang-root /tmp/sglang_whl --shapes qwen3-30b-a3b --tokens ${DENSE_BENCH_T:-16,32,64} \
                > "$OUT/bench_fused_moe.log" 2>&1 || status=1
            grep -v -i warn "$OUT/bench_fused_moe.log" | tail -24 | cut -c1-120 ;;
        grouptune) echo "=== grouped tiles on dense routing at T = ${GT_T:-32,64}, A/B against the shipped rows"
            timeout -k 10 $(( ${GT_S:-200} + 40 )) python3 benchmarks/gpu/sweep_moe.py --out "$OUT/g" \
                --budget-s ${GT_S:-200} --structure grouped --routings dense \
                --shapes ${GT_SHAPES:-qwen3-30b-a3b} --tokens ${GT_T:-32,64} --tile-tokens ${GT_T:-32,64} \
                > "$OUT/sweep.log" 2>&1 || status=1
            grep -v -i warn "$OUT/sweep.log" | cut -c1-230 | tail -4
            table=kernels/configs/NVIDIA_H200.json
            cp "$table" "$OUT/table_old.json"
            read -r -a prov < <(python3 -c "import json, sys; p = json.load(open(sys.argv[1]))['provenance']; \
print(' '.join([s['file'] for s in p['sweeps'] if not s.get('replace')] + ['--trace'] + [t['file'] for t in p.get('traces', [])]))" "$table")
            python3 benchmarks/gpu/tuned_configs.py --keep-faster "${prov[@]}" --replace "$OUT/g/sweep_moe.json" \
                --out "$OUT/new" > "$OUT/tuned.log" 2>&1 && cp "$OUT/new/NVIDIA_H200.json" "$OUT/table_new.json" \
                || { status=1; cat "$OUT/tuned.log"; }
            tarball=$(ls .device_carry/*.tar.xz 2>/dev/null | head -1 || true)
            [ -f /tmp/sgl-bundle/site/sgl_kernel/__init__.py ] || [ -z "$tarball" ] || \
                BUNDLE_CHECK=off bash benchmarks/gpu/install_bundle.sh "$tarball" > "$OUT/bundle.log" 2>&1 || status=1
            unpack_sglang_wheel
            for r in $(seq 1 ${GT_ROUNDS:-3}); do
                for v in old new; do
                    [ -f "$OUT/table_$v.json" ] || continue
                    cp "$OUT/table_$v.json" "$table"
                    timeout -k 10 ${GT_BENCH_S:-90} python3 benchmarks/bench_fused_moe.py --out "$OUT/ab_${v}_$r" \
                        --no-tune --dense-only --sglang-root /tmp/sglang_whl --sgl-kernel-site /tmp/sgl-bundle/site \
                        --shapes ${GT_SHAPES:-qwen3-30b-a3b} --tokens ${GT_T:-32,64} \
                        > "$OUT/ab_${v}_$r.log" 2>&1 || status=1
                done
            done
            cp "$OUT/table_old.json" "$table"
            python3 benchmarks/kernel_tables.py ab "$OUT" || status=1 ;;
        densegrid) echo "=== dense MoE layer against SGLang with its CUDA align inside, ${DG_ROUNDS:-3} rounds"
            tarball=$(ls .device_carry/*.tar.xz 2>/dev/null | head -1 || true)
            [ -f /tmp/sgl-bundle/site/sgl_kernel/__init__.py ] || [ -z "$tarball" ] || \
                BUNDLE_CHECK=off bash benchmarks/gpu/install_bundle.sh "$tarball" > "$OUT/bundle.log" 2>&1 || status=1
            unpack_sglang_wheel
            dg_run() {  # dg_run NAME [VAR=value ...]: one dense-only run under those settings
                local name=$1; shift
                env "$@" timeout -k 10 ${DG_S:-150} python3 benchmarks/bench_fused_moe.py --out "$OUT/$name" \
                    --no-tune --dense-only --sglang-root /tmp/sglang_whl --sgl-kernel-site /tmp/sgl-bundle/site \
                    --shapes ${DG_SHAPES:-qwen3-30b-a3b,olmoe-1b-7b,mixtral-8x7b} \
                    --tokens ${DG_T:-1,2,4,8,16,32,64} > "$OUT/$name.log" 2>&1 || status=1
            }
            for r in $(seq 1 ${DG_ROUNDS:-3}); do
                dg_run "ab_old_$r"
                [ -z "${DG_NEW_ENV:-}" ] || dg_run "ab_new_$r" $DG_NEW_ENV
            done
            python3 benchmarks/kernel_tables.py ab "$OUT" || status=1 ;;
        cudaalign) echo "=== dense MoE layer with SGLang's CUDA align (sgl_kernel) inside its time"
            tarball=$(ls .device_carry/*.tar.xz 2>/dev/null | head -1 || true)
            [ -f /tmp/sgl-bundle/site/sgl_kernel/__init__.py ] || [ -z "$tarball" ] || \
                BUNDLE_CHECK=off bash benchmarks/gpu/install_bundle.sh "$tarball" > "$OUT/bundle.log" 2>&1 || status=1
            unpack_sglang_wheel
            timeout -k 10 ${CUDA_ALIGN_S:-200} python3 benchmarks/bench_fused_moe.py --out "$OUT" --no-tune \
                --sglang-root /tmp/sglang_whl --sgl-kernel-site /tmp/sgl-bundle/site \
                --tokens ${CUDA_ALIGN_T:-8,16,32,64} > "$OUT/bench_fused_moe.log" 2>&1 || status=1
            grep -v -i warn "$OUT/bench_fused_moe.log" | tail -40 | cut -c1-140
            python3 benchmarks/kernel_tables.py dense "$OUT" || status=1 ;;
        profile) echo "=== per-kernel time of selection + fused_moe in a graph"
            timeout -k 10 ${PROFILE_S:-150} python3 benchmarks/gpu/profile_moe.py --out "$OUT" \
                > "$OUT/profile.log" 2>&1 || status=1
            grep -v -i warn "$OUT/profile.log" | cut -c1-140 | tail -60 ;;
        *) echo "unknown part '$part' (check checkall pytest sweep bench full extend grouptune densegrid cudaalign profile)" >&2; exit 2 ;;
    esac
done
exit $status
