"""base-serve's default policy is core.DEFAULT_POLICY (base_plus), reported by /v1/models; the
paper's BASE stays selectable as `base` (flag or BASE_POLICY)."""

import pytest
from fastapi.testclient import TestClient

from base_sglang.core import DEFAULT_POLICY, SelectionConfig
from base_sglang.server.__main__ import build_parser
from base_sglang.server.app import create_app
from base_sglang.server.backends import create_backend
from base_sglang.server.settings import Settings


@pytest.fixture(autouse=True)
def _no_policy_env(monkeypatch):
    monkeypatch.delenv("BASE_POLICY", raising=False)


def test_settings_and_cli_default_to_base_plus(monkeypatch):
    assert Settings().policy == DEFAULT_POLICY == "base_plus"
    assert build_parser(Settings()).parse_args([]).policy == DEFAULT_POLICY
    assert build_parser(Settings()).parse_args(["--policy", "base"]).policy == "base"
    monkeypatch.setenv("BASE_POLICY", "base")
    assert Settings().policy == "base"


def test_models_route_reports_the_default_policy(server_model_dir):
    settings = Settings(model=str(server_model_dir), served_model_name="tiny")
    backend = create_backend(settings)
    assert backend.engine.runner.patch.config == SelectionConfig(policy="base_plus")
    with TestClient(create_app(backend, settings)) as client:
        [card] = client.get("/v1/models").json()["data"]
    assert card["id"] == "tiny" and card["policy"] == "base_plus"
