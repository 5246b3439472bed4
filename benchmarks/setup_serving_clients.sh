#!/usr/bin/env bash
# The two load generators of benchmarks/bench_serving_clients.py, unmodified, on a CPU machine:
#   - SGLang's `python -m sglang.bench_serving` (sglang 0.5.23): a venv over the sglang CPU venv
#     that tests/run.sh builds, plus `datasets` (bench_serving imports it at start-up);
#   - vLLM's `vllm bench serve` client (vllm.benchmarks.serve of vllm 0.33.0): the wheel installed
#     with --no-deps into a folder (the engine and its CUDA stack are never imported), plus the few
#     pure-Python packages its import chain needs, on the same interpreter.
# Nothing here changes the sglang venv of tests/run.sh. Prints the two lines to export.
set -euo pipefail
cd "$(dirname "$0")/.."
SGL_VENV="${BASE_SGLANG_VENV:-$HOME/.cache/base-sglang/venv-sglang-0.5.23}"
DEST="${BASE_BENCH_CLIENTS:-$HOME/.cache/base-sglang/bench-clients}"
VLLM_VERSION=0.33.0
[ -x "$SGL_VENV/bin/python" ] || { echo "no sglang venv at $SGL_VENV: run tests/run.sh first" >&2; exit 2; }
PYVER="$("$SGL_VENV/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')"
mkdir -p "$DEST"
if [ ! -x "$DEST/venv/bin/python" ]; then
    python -m venv "$DEST/venv"
    # the sglang venv's packages, behind this venv's own (a .pth line adds the folder to sys.path)
    echo "$SGL_VENV/lib/$PYVER/site-packages" > "$DEST/venv/lib/$PYVER/site-packages/zz_sglang_venv.pth"
fi
"$DEST/venv/bin/python" -m pip install -q "datasets==5.2.0" "python-dateutil<3"
if [ ! -d "$DEST/vllm/vllm" ]; then
    WHEELS="$(mktemp -d)"
    "$DEST/venv/bin/python" -m pip download -q --no-deps "vllm==$VLLM_VERSION" -d "$WHEELS"  # ~340 MB
    "$DEST/venv/bin/python" -m pip install -q --no-deps --target "$DEST/vllm" "$WHEELS"/vllm-*.whl
    rm -rf "$WHEELS"
fi
# what `from vllm.benchmarks.serve import main` imports beyond the sglang venv (found by importing)
"$DEST/venv/bin/python" -m pip install -q --no-deps --target "$DEST/vllm-deps" \
    cbor2==6.3.0 cachetools==8.0.2 cloudpickle==3.1.3 py-cpuinfo==9.0.0 prometheus_client==0.26.0 \
    openai-harmony==0.0.8 "openai==3.57.0" "llguidance>=1.7,<1.8"
PYTHONPATH="$DEST/vllm:$DEST/vllm-deps" "$DEST/venv/bin/python" -c \
    "from vllm.benchmarks.serve import main; import sglang.bench_serving" 2>/dev/null
echo "export BENCH_CLIENT_PYTHON=$DEST/venv/bin/python"
echo "export BENCH_VLLM_PATH=$DEST/vllm:$DEST/vllm-deps"
