# Shell helpers of the SGLang-on-GPU scripts (sourced, not run). Needs: cd to the repo root first.
#   sgl_setup              find SGLang: /tmp/sgl-bundle (installing .device_carry/*.tar.xz with
#                          install_bundle.sh when absent; re-registering this checkout with
#                          bundle_register.py when present) or an installed sglang; exports SGL_ENV
#   with_sgl CMD...        run CMD with the bundle's environment (env.sh) in a subshell
#   project_check          base_sglang (+ kernels, server, the sglang.srt.plugins entry point)
#                          importable under SGLang's environment; pip install -e . when not
#   start_group LOG CMD... start CMD in its own process group (setsid); its id in LAST_GROUP
#   stop_group PGID        TERM the group, KILL after 20 s; every started group is stopped on exit
#   wait_http URL SECS PGID  poll URL until HTTP 200; fails early if the group died
#   run_part NAME SECS CMD...  CMD under `timeout SECS` (capped by DEADLINE_S when set: never past
#                          it, skipped when under 60 s remain); its rc and time into RESULT[NAME]
#   part_summary           one line per part of RESULT
#   decode_run DIR LOG SECS ENV_ARG... -- ARG...  one bench_decode.py run in SGLang (uniform-random
#                          routing, plugin on, results in DIR, output in LOG) under `timeout SECS`
#                          and `env ENV_ARG...` (e.g. BASE_FOLD=off, or -u BASE_POLICY)

BUNDLE_DIR=${BUNDLE_DIR:-/tmp/sgl-bundle}
STARTED_GROUPS=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

sgl_setup() {
    if [ -f "$BUNDLE_DIR/env.sh" ]; then
        SGL_ENV="$BUNDLE_DIR/env.sh"
        # installed by an earlier call: point its project links at this checkout
        if [ -f benchmarks/gpu/bundle_register.py ]; then
            python3 benchmarks/gpu/bundle_register.py "$PWD" "$BUNDLE_DIR" >/dev/null \
                || log "bundle_register.py failed: the bundle may still link an older checkout"
        fi
    else
        local tarball
        tarball=$(ls .device_carry/*sgl*.tar.xz .device_carry/*.tar.xz 2>/dev/null | head -1 || true)
        if [ -n "$tarball" ] && [ -f benchmarks/gpu/install_bundle.sh ]; then
            log "installing the SGLang bundle $tarball"
            bash benchmarks/gpu/install_bundle.sh "$tarball"
            SGL_ENV="$BUNDLE_DIR/env.sh"
        elif python3 -c "import sglang" 2>/dev/null; then
            SGL_ENV=""
        else
            echo "no SGLang: neither $BUNDLE_DIR/env.sh, nor a bundle in .device_carry/ (carry it)," \
                 "nor an installed sglang" >&2
            return 1
        fi
    fi
    export SGL_ENV
    log "SGLang environment: ${SGL_ENV:-installed sglang}"
}

with_sgl() { bash benchmarks/gpu/sgl_exec.sh "$@"; }

project_check() {
    local probe='
import base_sglang.kernels, base_sglang.server, sglang
from importlib.metadata import entry_points
eps = [e.value for e in entry_points(group="sglang.srt.plugins")]
assert "base_sglang.plugin:register" in eps, f"plugin entry point missing: {eps}"
print("sglang", sglang.__version__, "| base_sglang", base_sglang.__file__)'
    if with_sgl python3 -c "$probe" 2>/dev/null; then
        with_sgl python3 -c "$probe"
        return 0
    fi
    log "base_sglang or its plugin entry point is not visible: pip install --no-deps -e ."
    python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/base-bench-pip.log 2>&1 \
        || { tail -5 /tmp/base-bench-pip.log; return 1; }
    with_sgl python3 -c "$probe"
}

start_group() {  # start_group LOG CMD... ; sets LAST_GROUP (call it directly, not in $(...))
    local logf=$1; shift
    setsid "$@" >"$logf" 2>&1 < /dev/null &
    LAST_GROUP=$!
    STARTED_GROUPS+=("$LAST_GROUP")
}

stop_group() {
    local pg=$1 i
    kill -0 "$pg" 2>/dev/null || return 0
    kill -TERM -- "-$pg" 2>/dev/null || true
    for i in $(seq 1 40); do
        kill -0 "$pg" 2>/dev/null || return 0
        sleep 0.5
    done
    kill -KILL -- "-$pg" 2>/dev/null || true
}

stop_all_groups() {
    local pg
    for pg in "${STARTED_GROUPS[@]:-}"; do
        if [ -n "$pg" ]; then stop_group "$pg"; fi
    done
    return 0
}

wait_http() {  # wait_http URL SECONDS PGID
    local url=$1 secs=$2 pg=$3 t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$secs" ]; do
        if ! kill -0 "$pg" 2>/dev/null; then
            log "server process group $pg exited before $url answered"
            return 1
        fi
        if python3 - "$url" <<'PY' 2>/dev/null; then
import sys, urllib.request
sys.exit(0 if urllib.request.urlopen(sys.argv[1], timeout=3).status == 200 else 1)
PY
            log "$url is up after $((SECONDS - t0)) s"
            return 0
        fi
        sleep 2
    done
    log "$url did not answer within $secs s"
    return 1
}

declare -gA RESULT
run_part() {  # run_part NAME SECS CMD...
    local name=$1 secs=$2 t0=$SECONDS rc=0; shift 2
    if [ -n "${DEADLINE_S:-}" ]; then
        local left=$((DEADLINE_S - SECONDS - 15))
        secs=$(( secs < left ? secs : left ))
        if [ "$secs" -lt 60 ]; then
            log "=== $name: skipped, ${left} s left before the deadline"
            RESULT[$name]="skipped"
            return 1
        fi
    fi
    log "=== $name (limit $secs s)"
    timeout -k 15 "$secs" "$@" || rc=$?
    RESULT[$name]="rc=$rc $((SECONDS - t0))s"
    log "=== $name: rc=$rc in $((SECONDS - t0)) s"
    [ $rc -eq 0 ]
}

part_summary() {
    echo
    log "summary"
    local k
    for k in "${!RESULT[@]}"; do echo "  $k: ${RESULT[$k]}"; done
}

decode_run() {  # decode_run DIR LOG SECS ENV_ARG... -- ARG...
    local dir=$1 logf=$2 secs=$3 envs=(); shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    mkdir -p "$dir"
    timeout -k 15 "$secs" env "${envs[@]}" bash benchmarks/gpu/sgl_exec.sh python3 benchmarks/gpu/bench_decode.py \
        --routing uniform-random --plugin on --out "$dir" "$@" > "$logf" 2>&1
}
