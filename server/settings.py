"""Server settings: CLI flags and BASE_* environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

from base_sglang.engine.config import DEFAULT_MODEL_DIR


class Settings(BaseSettings):
    """Every field can be set as BASE_<NAME> (e.g. BASE_DEFAULT_BUDGET=4) or as --<name> on the CLI."""

    model_config = SettingsConfigDict(env_prefix="BASE_", protected_namespaces=())

    model: str = str(DEFAULT_MODEL_DIR)
    served_model_name: str | None = None  # /v1/models id; default: the model directory's name
    predictor: str | None = None  # default: <model>/predictor.safetensors when present
    policy: str = "base"
    default_budget: str = "dense"  # experts per MoE layer per decode step, or "dense"
    min_budget: int = 1
    max_budget: int | None = None  # default: E (dense allowed)
    host: str = "127.0.0.1"
    port: int = 8000
    max_running_requests: int = 32
    max_waiting_requests: int = 256
    backend: str = "native"
    api_key: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    num_threads: int | None = None  # torch CPU threads (native backend)
    log_level: str = "info"
    backend_args: list[str] = []  # CLI arguments base-serve does not know, for the backend (sglang)
