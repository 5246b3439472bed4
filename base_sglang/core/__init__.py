"""BASE selection core: pure torch, imports nothing beyond torch (and safetensors lazily)."""

from .config import DEFAULT_POLICY, POLICIES, SelectionConfig
from .moe_ref import expert_output_norms, expert_outputs, moe_forward_ref, routed_outputs
from .predictor import Predictor, PredictorMeta, PredictorMismatch, describe_model_config
from .selection import Selection, SelectionStats, select_experts

__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "Predictor",
    "PredictorMeta",
    "PredictorMismatch",
    "Selection",
    "SelectionConfig",
    "SelectionStats",
    "describe_model_config",
    "expert_output_norms",
    "expert_outputs",
    "moe_forward_ref",
    "routed_outputs",
    "select_experts",
]
