"""Fold BASE's predictor into each MoE block's router GEMM of a loaded SGLang model.

A block that runs `router_logits, _ = self.gate(x); self.topk(x, router_logits)` (Qwen2/3-MoE,
OLMoE, Mixtral) gets the predictor's rows stacked under its gate's ([2E, H], core.routing), so the
gate returns [T, 2E]: the logits, then z . a_e. The TopK hook (hooks.around_topk) splits them: in
BASE decode steps the router's top-k and the selection run from them (kernels.route_select_experts,
in one launch or two as kernels.route_mode says, or, past the batch sizes those were timed at, our
top-k launch and the unfolded selection); elsewhere SGLang's
own top-k gets the first E columns. A block is folded only when nothing else reads the gate's output
and SGLang's top-k would be a plain softmax top-k; `fold_gates` says why it left a block alone.
"""

from __future__ import annotations

import logging

import torch

from base_sglang.core import Predictor, SelectionConfig, select_experts
from base_sglang.core.routing import fold_router, route_select

from .compat import shared_topk_columns

log = logging.getLogger("base_sglang.plugin")

# SGLang server flags under which SGLang's own select_experts must run (it records what we skip)
_NEEDS_SGLANG_TOPK = ("enable_return_routed_experts", "expert_distribution_recorder_mode",
                      "enable_expert_distribution_metrics")


def unfoldable(block, predictor: Predictor, config: SelectionConfig) -> str | None:
    """Why this MoE block's gate cannot be folded, or None when it can."""
    from sglang.srt.layers.linear import ReplicatedLinear

    from base_sglang.kernels.select_experts import route_foldable

    topk, gate = block.topk, block.gate
    cfg = topk.topk_config
    layer = getattr(topk, "layer_id", None)
    if layer is None or not route_foldable(config, layer, predictor):
        return f"policy {config.policy!r} does not run from a folded router at layer {layer}"
    if type(gate) is not ReplicatedLinear or getattr(gate, "bias", None) is not None:
        return f"gate {type(gate).__name__} is not a bias-free ReplicatedLinear"
    if type(gate.quant_method).__name__ != "UnquantizedLinearMethod" or getattr(
            gate, "use_intel_amx_backend", False):
        return f"gate runs {type(gate.quant_method).__name__} (a packed or quantized weight)"
    w = gate.weight
    E = predictor.meta.num_experts
    if w.dim() != 2 or w.shape[0] != E or w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"gate weight {tuple(w.shape)} {w.dtype} is not [E={E}, H] float"
    plain = (not cfg.use_grouped_topk and cfg.custom_routing_function is None
             and cfg.correction_bias is None and getattr(cfg, "scoring_func", "softmax") == "softmax"
             and cfg.routed_scaling_factor in (None, 1.0) and shared_topk_columns(cfg) == 0
             and not getattr(cfg, "sqrtsoftplus_log1p", False)
             and not getattr(cfg, "fused_gate_packed_ids", False))
    if not plain:
        return "its top-k is not a plain softmax top-k (grouped, biased, scaled or shared slots)"
    return None


def _router_rows_loader(E: int):
    def load(param: torch.nn.Parameter, loaded: torch.Tensor, *args, **kwargs) -> None:
        if tuple(loaded.shape) != (E, param.shape[1]):
            raise ValueError(f"folded router gate: a weight update of shape {tuple(loaded.shape)}, "
                             f"expected the router's [{E}, {param.shape[1]}] (BASE_FOLD=off to "
                             f"load other shapes)")
        param.data[:E].copy_(loaded)

    return load


def fold_gates(model, predictor: Predictor, config: SelectionConfig, server_args=None) -> dict:
    """Stack the predictor under every foldable gate; marks its TopK with `base_fold = E`.
    Returns {layer id: reason} for the MoE blocks left unfolded (empty when all were folded)."""
    from sglang.srt.layers.moe.topk import TopK

    skip = [f for f in _NEEDS_SGLANG_TOPK if server_args is not None and getattr(server_args, f, None)]
    left, folded = {}, 0
    for module in model.modules():
        topk = getattr(module, "topk", None)
        if not isinstance(topk, TopK) or not hasattr(module, "gate"):
            continue
        why = (f"--{skip[0].replace('_', '-')} needs SGLang's own top-k" if skip
               else unfoldable(module, predictor, config))
        if why is not None:
            left[getattr(topk, "layer_id", None)] = why
            continue
        gate = module.gate
        stacked = fold_router(gate.weight.data, predictor, topk.layer_id)  # [2E, H]
        gate.weight = torch.nn.Parameter(stacked, requires_grad=False)
        E = predictor.meta.num_experts
        # weight updates (update_weights_from_disk / _tensor) load the router's [E, H] rows: they
        # land in the first half, the predictor's rows stay
        gate.weight.weight_loader = _router_rows_loader(E)
        topk.base_fold = E
        folded += 1
    log.info("BASE: predictor folded into %d router GEMMs; %d MoE blocks left unfolded%s", folded,
             len(left), f" ({next(iter(left.values()))})" if left else "")
    return left


def folded_topk(st, topk, hidden_states, logits, yhat):
    """The router's top-k + BASE of a folded block in a decode step, from its gate's two halves
    ([T, E] each; st = plugin.state.STATE): the StandardTopKOutput SGLang's TopK would return."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    n, E = logits.shape
    layer, cfg = topk.layer_id, topk.topk_config
    k, renorm = cfg.top_k, cfg.renormalize
    budget = st.budget[:n]
    if not logits.is_cuda or st.select is select_experts:  # the torch core (CPU, BASE_KERNELS=off)
        sel, _, _ = route_select(logits, yhat, budget, layer, st.selection, st.predictor, top_k=k,
                                 norm_topk_prob=renorm)
    else:
        from base_sglang.kernels import base_route_select, route_select_experts, route_wins

        if route_wins(n, E):  # top-k + selection from the folded GEMM, in one launch or two
            sel = route_select_experts(logits, yhat, budget, layer, st.selection, st.predictor,
                                       top_k=k, norm_topk_prob=renorm)
        else:  # our top-k launch (reads the strided logits), then the unfolded selection
            ids, w, _, _ = base_route_select(logits, None, None, budget, top_k=k, renormalize=renorm)
            sel = st.select(logits, ids, w, hidden_states, budget, layer, st.selection,
                            st.predictor, norm_topk_prob=renorm)
    st.record(st.predictor.slot(layer), sel.stats.num_union, sel.stats.num_kept)
    if st.sel_trace is not None:
        st.sel_trace.keep(st.predictor.slot(layer), sel.ids, sel.weights)
    return StandardTopKOutput(topk_weights=sel.weights, topk_ids=sel.ids, router_logits=logits)
