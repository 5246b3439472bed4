"""Server settings: CLI flags and BASE_* environment variables (pydantic-settings).

Every value is checked here, before anything is loaded, so a bad flag or variable ends base-serve
with one line naming it (the checks that need the model, e.g. a budget above E, run after load).
"""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from base_sglang.core import DEFAULT_POLICY, POLICIES
from base_sglang.core.budget import parse_budget
from base_sglang.engine.config import DEFAULT_MODEL_DIR

LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class Settings(BaseSettings):
    """Every field can be set as BASE_<NAME> (e.g. BASE_DEFAULT_BUDGET=4) or as --<name> on the CLI."""

    model_config = SettingsConfigDict(env_prefix="BASE_", protected_namespaces=())

    model: str = str(DEFAULT_MODEL_DIR)
    served_model_name: str | None = None  # /v1/models id; default: the model directory's name
    predictor: str | None = None  # default: <model>/predictor.safetensors when present
    policy: str = DEFAULT_POLICY  # base_plus; "base" is the paper's BASE
    default_budget: str = "dense"  # experts per MoE layer per decode step, or "dense"
    min_budget: int = Field(1, ge=1)
    max_budget: int | None = Field(None, ge=1)  # default: E (dense allowed)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_running_requests: int = Field(32, ge=1)
    max_waiting_requests: int = Field(256, ge=0)
    backend: str = "native"
    api_key: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    num_threads: int | None = Field(None, ge=1)  # torch CPU threads (native backend)
    max_model_len: int | None = Field(None, ge=2)  # tokens per request; default: the model's
    max_request_bytes: int = Field(8 << 20, ge=1024)  # larger request bodies get 413
    shutdown_timeout: float = Field(30.0, ge=0, allow_inf_nan=False)  # drain deadline, seconds
    log_level: str = "info"
    backend_args: list[str] = []  # CLI arguments base-serve does not know, for the backend (sglang)

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy; choose one of {', '.join(POLICIES)}")
        return v

    @field_validator("default_budget", mode="before")
    @classmethod
    def _budget(cls, v) -> str:
        parse_budget(v, "default_budget")  # the range check needs E: after the model loads
        return str(v).strip()

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v not in ("auto", "cpu", "cuda") and not (v.startswith("cuda:") and v[5:].isdigit()):
            raise ValueError("must be auto, cpu, cuda or cuda:N")
        return v

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        if v not in DTYPES:
            raise ValueError(f"must be one of {', '.join(DTYPES)}")
        return v

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.lower() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)}")
        return v.lower()

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        from base_sglang.server.backends import BACKENDS

        if v not in BACKENDS:
            raise ValueError(f"unknown backend; choose one of {', '.join(sorted(BACKENDS))}")
        return v
