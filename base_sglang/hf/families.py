"""The MoE families this project serves and calibrates, by transformers model_type.

All five run, in transformers 5, `_, weights, ids = block.gate(x); y = block.experts(x, ids, weights)`
(+ shared experts), with experts holding gate_up_proj [E, 2I, H] and down_proj [E, H, I].
"""

from __future__ import annotations

from typing import Any

FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v2")


def check_family(config: Any) -> str:
    """The config's model_type if it is a supported family; else ValueError naming it."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(f"model: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(FAMILIES)}")
    return model_type
