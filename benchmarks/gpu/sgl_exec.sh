#!/usr/bin/env bash
# Run a command under the SGLang bundle's environment: SGL_ENV = its env.sh (empty: as it is).
#   SGL_ENV=/tmp/sgl-bundle/env.sh bash benchmarks/gpu/sgl_exec.sh python3 -m sglang.launch_server ...
set -eu
if [ -n "${SGL_ENV:-}" ]; then
    set +u
    # shellcheck disable=SC1090
    source "$SGL_ENV"
    set -u
fi
exec "$@"
