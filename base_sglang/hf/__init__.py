"""The transformers adapter: the one place that knows how a transformers MoE checkpoint looks.

    families.py  the supported MoE families and the architecture check
    loader.py    load a local checkpoint and its tokenizer (one device/dtype "auto" rule)
    blocks.py    find the MoE blocks of a loaded model; run its experts (via core.moe_ref)
    patch.py     MoEPatch: the selection core inside the blocks' routing, per decode step
The engine, calibration, evaluation, benchmarks and tests all go through these.
"""

from .blocks import find_moe_blocks, norm_topk_prob
from .families import FAMILIES, check_family
from .loader import eos_token_ids, load_model, resolve_device, resolve_dtype
from .patch import MoEPatch, StepContext, decode_step, reset_step

__all__ = ["FAMILIES", "MoEPatch", "StepContext", "check_family", "decode_step",
           "eos_token_ids", "find_moe_blocks", "load_model", "norm_topk_prob", "reset_step",
           "resolve_device", "resolve_dtype"]
