"""Engine settings: one frozen dataclass, validated once, read by the CLI for its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core import DEFAULT_POLICY, POLICIES
from ..core.budget import DENSE_LABEL, parse_budget

# The embedded proxy checkpoint (config, tokenizer, safetensors, predictor.safetensors).
DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "proxy-moe"
PREDICTOR_FILE = "predictor.safetensors"


@dataclass(frozen=True)
class EngineConfig:
    """model           : Hugging Face checkpoint directory (any supported transformers MoE).
    predictor       : predictor file; None -> <model>/predictor.safetensors when it exists.
    policy          : selection policy applied in decode steps (prefill is always dense); default
                      core.DEFAULT_POLICY (base_plus); "base" is the paper's BASE.
    default_budget  : experts per MoE layer per decode step for requests that set none: an int
                      1..E or "dense" (checked against E when the model is loaded).
    max_running_requests : rows in one decode batch.
    max_waiting_requests : bounded waiting queue; add_request raises QueueFull beyond it.
    max_prefill_tokens   : padded tokens (rows x longest prompt) admitted in one prefill batch.
    max_model_len   : prompt + output tokens per request; None -> the model's max_position_embeddings.
    device, dtype   : "cpu" / "cuda" / "auto"; "auto" / "float32" / "bfloat16" / "float16".
    num_threads     : torch CPU threads (None: torch's default). On a busy or small CPU, 1 avoids
                      OpenMP threads spinning against each other.
    """

    model: str = str(DEFAULT_MODEL_DIR)
    predictor: str | None = None
    policy: str = DEFAULT_POLICY
    default_budget: int | str = DENSE_LABEL
    max_running_requests: int = 32
    max_waiting_requests: int = 256
    max_prefill_tokens: int = 8192
    max_model_len: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    num_threads: int | None = None

    def __post_init__(self):
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown policy {self.policy!r}; choose one of {POLICIES}")
        parse_budget(self.default_budget, "default_budget")  # the range check needs E (engine)
        for name in ("max_running_requests", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_waiting_requests < 0:
            raise ValueError(f"max_waiting_requests: must be >= 0, got {self.max_waiting_requests}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"num_threads: must be >= 1, got {self.num_threads}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len: must be >= 2, got {self.max_model_len}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device: must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: must be auto, float32, bfloat16 or float16, got {self.dtype!r}")

    @property
    def predictor_path(self) -> Path | None:
        """The predictor file to load, or None (explicit path, else the model directory's default)."""
        if self.predictor is not None:
            return Path(self.predictor)
        default = Path(self.model) / PREDICTOR_FILE
        return default if default.is_file() else None
