"""base-sglang: BASE (batch-aware selection of experts by predicted removal error) for MoE decoding."""

from .core import Predictor, SelectionConfig, select_experts

__version__ = "0.1.0"
__all__ = ["Predictor", "SelectionConfig", "select_experts", "__version__"]
