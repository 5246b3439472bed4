"""MoEPatch: the selection core inside a transformers model's MoE blocks (engine, evaluation, tests).

Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral and DeepSeek-V2 blocks in transformers 5 all run
    _, weights, ids = block.gate(x);  y = block.experts(x, ids, weights)  (+ shared experts)
so a wrapper around `block.gate` applies the selection, and a wrapper around `block.experts` runs
what the selection decided with this project's own expert code: dropped slots are -1 and are never
computed (core.moe_ref on the CPU, kernels.fused_moe on CUDA). Nothing relies on what a transformers
experts implementation does with ids it was not written for. At patch time a self-test checks that
the model's experts compute the function our expert code assumes (weight layout, activation); a
model whose experts differ is refused with a message naming its class.

The batch metadata comes from one module-level context set around each forward:
    with decode_step(budget) as step:   # budget [T] int, one per flattened token row
        model(...)
    step.stats[layer_id] -> SelectionStats
Outside a decode_step (prefill, plain forward) every block runs dense and unchanged, through the
model's own experts implementation. `decode_step(budget, skip_selection=True)` is a promise from the
caller (who knows the budgets on the host) that a budgeted policy cannot change this step: every row
is real and either every row is dense or the batch budget M covers every routed pair (M >= T * K, so
the kept set is the whole union). Budgeted policies then return the router's choice as it is, only
count the experts, and the model's own experts implementation runs the unchanged routing.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core import (
    Predictor,
    SelectionConfig,
    SelectionStats,
    expert_output_norms,
    moe_forward_ref,
    select_experts,
)
from ..core.config import TRUE_NORM_POLICIES
from ..core.moe_ref import all_expert_outputs
from ..core.predictor import describe_model_config
from .blocks import check_experts, find_moe_blocks, norm_topk_prob


@dataclass
class StepContext:
    budget: torch.Tensor  # [T] int per token row
    skip_selection: bool = False  # set by the caller (never inferred here: no host sync)
    max_error: torch.Tensor | None = None  # [T] float error bound per row, NaN = none (core.error_budget)
    max_experts: int | None = None  # host bound on any row's budget below E (a tile hint), or None
    stats: dict[int, SelectionStats] = field(default_factory=dict)
    ids: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> executed ids [T, K]
    as_routed: set[int] = field(default_factory=set)  # layers whose routing was left unchanged


_current: StepContext | None = None


@contextmanager
def decode_step(budget: torch.Tensor, skip_selection: bool = False,
                max_error: torch.Tensor | None = None, max_experts: int | None = None):
    """Run the MoE blocks under the selection policy for one decode step (no nesting).

    max_error [T] (optional): per-row predicted-error bounds; such steps run the core's selection.
    max_experts (optional): the largest row budget when the caller knows it on the host and it is
    below E; the CUDA expert kernel then takes its tiles tuned for BASE-selected ids (fused_moe).
    """
    global _current
    if _current is not None:
        raise RuntimeError("decode_step contexts cannot be nested")
    _current = StepContext(budget=budget, skip_selection=skip_selection, max_error=max_error,
                           max_experts=max_experts)
    try:
        yield _current
    finally:
        _current = None


def reset_step() -> None:
    global _current
    _current = None


class MoEPatch:
    """Wraps every MoE block's router and experts of a transformers model; `remove()` restores them."""

    def __init__(self, model: nn.Module, config: SelectionConfig,
                 predictor: Predictor | None = None, use_kernels: bool | str = "auto"):
        self.model = model
        self.config = config
        self.predictor = predictor
        self.blocks = find_moe_blocks(model, require=True)
        if predictor is not None:
            predictor.validate(model.config)
        described = describe_model_config(model.config)
        self.num_experts = described["num_experts"]
        self.top_k = described["top_k"]
        self.norm_topk = norm_topk_prob(model.config)
        check_experts(next(iter(self.blocks.values())).experts, self.top_k)
        self.use_kernels = _kernels_usable(model) if use_kernels == "auto" else bool(use_kernels)
        self._select = select_experts
        self._run_experts = _run_experts_ref
        if self.use_kernels:
            from ..kernels import base_select_experts

            self._select = base_select_experts  # same contract; other policies fall back to the core
            self._run_experts = _run_experts_fused
        self._originals = {}
        for layer_id, block in self.blocks.items():
            self._originals[layer_id] = (block.gate.forward, block.experts.forward)
            block.gate.forward = self._wrap_gate(layer_id, block, block.gate.forward)
            block.experts.forward = self._wrap_experts(layer_id, block.experts,
                                                       block.experts.forward)

    def set_config(self, config: SelectionConfig) -> None:
        self.config = config

    def remove(self) -> None:
        for layer_id, block in self.blocks.items():
            block.gate.forward, block.experts.forward = self._originals[layer_id]
        self._originals = {}

    def _wrap_experts(self, layer_id: int, experts: nn.Module, experts_forward):
        """Decode steps run the selection's ids (-1 = dropped) with this project's expert code."""
        run = self._run_experts

        def forward(hidden_states, top_k_index, top_k_weights):
            step = _current
            if step is None or (layer_id in step.as_routed and not self.use_kernels):
                return experts_forward(hidden_states, top_k_index, top_k_weights)
            return run(experts, hidden_states, top_k_index, top_k_weights)

        return forward

    def _wrap_gate(self, layer_id: int, block: nn.Module, gate_forward):
        def forward(hidden_states, *args, **kwargs):
            out = gate_forward(hidden_states, *args, **kwargs)
            step = _current
            if step is None:
                return out
            logits, weights, ids = out
            if step.skip_selection and (self.config.uses_budget or self.config.policy == "dense"):
                step.stats[layer_id] = _dense_stats(ids.reshape(ids.shape[0], -1),
                                                    self.num_experts)
                step.ids[layer_id] = ids
                step.as_routed.add(layer_id)
                return out
            x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [T, H]
            select, norms = self._select, {}
            ex = block.experts
            if self.config.policy == "oracle_net":  # every expert's true norm: the core only
                select = select_experts
                norms["expert_norms"] = all_expert_outputs(
                    x, ex.gate_up_proj, ex.down_proj, ex.act_fn).norm(dim=-1).transpose(0, 1)  # [T, E]
            elif self.config.policy in TRUE_NORM_POLICIES:
                norms["routed_norms"] = expert_output_norms(x, ids, ex.gate_up_proj, ex.down_proj,
                                                            ex.act_fn)  # [T, K]
            sel = select(  # with max_error the Triton path hands the call to the core
                logits.reshape(x.shape[0], -1), ids.reshape(x.shape[0], -1),
                weights.reshape(x.shape[0], -1), x, step.budget, layer_id, self.config,
                self.predictor, norm_topk_prob=self.norm_topk, max_error=step.max_error, **norms)
            step.stats[layer_id] = sel.stats
            step.ids[layer_id] = sel.ids
            if self.config.policy == "dense" or layer_id in self.config.skip_layers:
                step.as_routed.add(layer_id)  # the router's own ids and weights, unchanged
            return logits, sel.weights.view_as(weights), sel.ids.view_as(ids)

        return forward


def _run_experts_ref(experts: nn.Module, hidden: torch.Tensor, ids: torch.Tensor,
                     weights: torch.Tensor) -> torch.Tensor:
    """The torch path: core.moe_ref over (token, slot) pairs; -1 slots are never computed."""
    return moe_forward_ref(hidden, ids, weights, experts.gate_up_proj, experts.down_proj,
                           experts.act_fn)


def _run_experts_fused(experts: nn.Module, hidden: torch.Tensor, ids: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
    """CUDA bf16/fp16: the expert-skipping Triton MoE (dropped experts' weights are never read)."""
    from ..kernels import fused_moe

    bound = _current.max_experts if _current is not None else None
    return fused_moe(hidden, ids, weights, experts.gate_up_proj, experts.down_proj,
                     max_experts=bound)


def _kernels_usable(model: nn.Module) -> bool:
    """Triton path: CUDA, bf16/fp16 weights, SiLU experts in the fused gate_up layout, triton present."""
    p = next(model.parameters())
    if not p.is_cuda or p.dtype not in (torch.bfloat16, torch.float16):
        return False
    if getattr(model.config, "hidden_act", "silu") != "silu":
        return False
    if any(getattr(b.experts, "has_bias", False) for b in find_moe_blocks(model).values()):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _dense_stats(ids: torch.Tensor, E: int) -> SelectionStats:
    """What select_experts reports when it keeps the whole union: nothing removed. ids [T, K]."""
    hit = torch.zeros(E, dtype=torch.bool, device=ids.device).index_fill_(0, ids.flatten().long(), True)
    n = hit.sum()  # [] distinct experts routed
    return SelectionStats(n, n.clone(), torch.zeros((), device=ids.device))
