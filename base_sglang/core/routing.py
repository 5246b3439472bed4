"""The router folded with BASE's predictor: one GEMM gives the logits and the predicted log-norms.

BASE's predictor is linear in the MoE input z, like the router, so their rows stack:
    scores = z @ fold_router(W_router, predictor, layer)^T    [T, 2E]
    logits = scores[:, :E]          the router's logits (as z @ W_router^T)
    yhat   = scores[:, E:] + b      predicted log ||E_e(z)|| of every expert e
`route_select` is the pure-torch path of that layer's routing + selection (softmax top-k, then
select_experts with those log-norms); kernels.base_route runs it in one launch. It covers routers
that take a softmax over E logits, then the top-k (ties -> lower id), renormalised or not
(Qwen2/3-MoE, OLMoE, Mixtral); others keep their own router and the unfolded selection.
Shape legend: T tokens, E experts, K slots, H hidden.
"""

from __future__ import annotations

import torch

from .config import SelectionConfig
from .predictor import Predictor
from .selection import Selection, select_experts


def softmax_topk(logits: torch.Tensor, top_k: int, renormalize: bool):
    """(weights [T, K] fp32, ids [T, K] int64) of a softmax top-k router, best first, ties -> lower id."""
    p = torch.softmax(logits.float(), dim=-1)  # [T, E]
    order = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = p.gather(1, order)  # [T, K]
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w, order


def fold_router(router_weight: torch.Tensor, predictor: Predictor, layer_id: int) -> torch.Tensor:
    """[2E, H] in the router's dtype and device: the router's rows, then the predictor's."""
    a = predictor.weight[predictor.slot(layer_id)]  # [E, H]
    if tuple(a.shape) != tuple(router_weight.shape):
        raise ValueError(f"predictor: layer {layer_id} has weights {tuple(a.shape)}, the router "
                         f"{tuple(router_weight.shape)}")
    return torch.cat([router_weight, a.to(router_weight.device, router_weight.dtype)], 0)


def route_select(
    logits: torch.Tensor,  # [T, E] the router's logits
    yhat: torch.Tensor,  # [T, E] z . a_e (without the bias) of every expert
    budget: torch.Tensor,  # [T] int (select_experts' budget semantics)
    layer_id: int,
    config: SelectionConfig,
    predictor: Predictor,
    *,
    top_k: int,
    norm_topk_prob: bool,
) -> tuple[Selection, torch.Tensor, torch.Tensor]:
    """(selection, routed ids [T, K] int64, routed weights [T, K] fp32) of one folded layer."""
    w, ids = softmax_topk(logits, top_k, norm_topk_prob)
    b = predictor.bias[predictor.slot(layer_id)].to(yhat.device).float()  # [E]
    log_norms = yhat.float().gather(1, ids) + b[ids]  # [T, K]
    sel = select_experts(logits, ids, w, None, budget, layer_id, config, predictor,
                         norm_topk_prob=norm_topk_prob, log_norms=log_norms)
    return sel, ids, w
