"""A loaded transformers MoE model's blocks and experts, as the rest of the project sees them.

find_moe_blocks: model layer id -> MoE block (a module with `.gate` and `.experts`).
check_experts:   refuse experts that compute something else than core.moe_ref assumes.
routed_outputs / all_expert_outputs: the experts module's outputs through core.moe_ref (fp32).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core import moe_ref


def find_moe_blocks(model: nn.Module, require: bool = False) -> dict[int, nn.Module]:
    """Model layer id -> MoE block (a module with `.gate` and `.experts` holding gate_up_proj).

    require: raise ValueError naming the model class when it has none.
    """
    layers = model.model.layers if hasattr(model, "model") else model.layers
    blocks = {}
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        experts = getattr(mlp, "experts", None)
        if mlp is not None and hasattr(mlp, "gate") and hasattr(experts, "gate_up_proj"):
            blocks[i] = mlp
    if require and not blocks:
        raise ValueError(f"model: no MoE blocks found in {type(model).__name__}")
    return blocks


def norm_topk_prob(config) -> bool:
    """Whether the model renormalises its top-k weights (Mixtral always does)."""
    if getattr(config, "model_type", "") == "mixtral":
        return True
    return bool(getattr(config, "norm_topk_prob", False))


def check_experts(experts: nn.Module, top_k: int) -> None:
    """Refuse a model whose experts module computes something else than core.moe_ref assumes.

    moe_ref reads gate_up_proj [E, 2I, H] (gate rows first), down_proj [E, H, I] and act_fn, with
    no biases. The flags transformers' experts decorator sets are checked, then the module's own
    forward is compared with moe_ref on a few tokens routed to real experts (no dropped slots).
    """
    name = type(experts).__name__
    for flag, want in (("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
                       ("has_gate", True)):
        if getattr(experts, flag, want) != want:
            raise ValueError(f"model: {name}.{flag} = {not want}: this experts layout is not "
                             f"supported by base_sglang's expert path")
    gate_up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if gate_up is None or down is None or gate_up.dim() != 3 or down.dim() != 3:
        raise ValueError(f"model: {name} has no 3-D gate_up_proj/down_proj expert weights")
    E, two_i, H = gate_up.shape
    if two_i % 2 or tuple(down.shape) != (E, H, two_i // 2):
        raise ValueError(f"model: {name} weights gate_up_proj {tuple(gate_up.shape)} and "
                         f"down_proj {tuple(down.shape)} are not [E, 2I, H] and [E, H, I]")
    if gate_up.device.type == "meta":
        return
    g = torch.Generator(device="cpu").manual_seed(0)
    T, K = 4, min(top_k, E)
    x = torch.randn(T, H, generator=g).to(gate_up.device, gate_up.dtype)  # [T, H]
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).to(gate_up.device)
    w = torch.rand(T, K, generator=g).to(gate_up.device, gate_up.dtype)  # [T, K]
    with torch.no_grad():
        theirs = experts(x, ids, w).float()  # [T, H] the library's own (dense) computation
        ours = moe_ref.moe_forward_ref(x, ids, w, gate_up, down, experts.act_fn).float()
    tol = 1e-4 if gate_up.dtype == torch.float32 else 3e-2
    err = ((theirs - ours).norm() / theirs.norm().clamp_min(1e-12)).item()
    if not err <= tol:  # also catches NaN
        raise ValueError(f"model: {name} (transformers experts implementation "
                         f"{getattr(getattr(experts, 'config', None), '_experts_implementation', '?')!r}) "
                         f"disagrees with base_sglang's expert path (relative error {err:.2e} > "
                         f"{tol:.0e}); refusing to patch this model")


def routed_outputs(x: torch.Tensor, ids: torch.Tensor, experts: nn.Module,
                   dense_tokens: int = 64) -> torch.Tensor:
    """Unweighted E_{ids[t,k]}(x[t]) for every routed slot, fp32 [T, K, H]."""
    return moe_ref.routed_outputs(x, ids, experts.gate_up_proj, experts.down_proj, experts.act_fn,
                                  dense_tokens)


def all_expert_outputs(x: torch.Tensor, experts: nn.Module) -> torch.Tensor:
    """Every expert on every token, fp32 [E, T, H]."""
    return moe_ref.all_expert_outputs(x, experts.gate_up_proj, experts.down_proj, experts.act_fn)
