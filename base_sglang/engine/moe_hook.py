"""Plug the selection core into transformers MoE blocks (native engine, evaluation, tests).

Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral and DeepSeek-V2 blocks in transformers 5 all run
    _, weights, ids = block.gate(x);  y = block.experts(x, ids, weights)  (+ shared experts)
so one wrapper around `block.gate` is enough: it applies the selection and hands the experts module
ids where dropped slots point at the sentinel expert E with weight 0. transformers' grouped_mm and
batched_mm experts skip sentinel rows (its expert-parallel convention), so a dropped expert is not run.

The batch metadata comes from one module-level context set around each forward:
    with decode_step(budget) as step:   # budget [T] int, one per flattened token row
        model(...)
    step.stats[layer_id] -> SelectionStats
Outside a decode_step (prefill, plain forward) every block runs dense and unchanged.
`decode_step(budget, skip_selection=True)` is a promise from the caller (who knows the budgets on the
host) that a budgeted policy cannot change this step: every row is real and either every row is dense
or the batch budget M covers every routed pair (M >= T * K, so the kept set is the whole union).
Budgeted policies then return the router's choice as it is and only count the experts.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from ..core import Predictor, SelectionConfig, SelectionStats, expert_output_norms, select_experts
from ..core.predictor import describe_model_config


@dataclass
class StepContext:
    budget: torch.Tensor  # [T] int per token row
    skip_selection: bool = False  # set by the caller (never inferred here: no host sync)
    stats: dict[int, SelectionStats] = field(default_factory=dict)
    ids: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> executed ids [T, K]


_current: StepContext | None = None


@contextmanager
def decode_step(budget: torch.Tensor, skip_selection: bool = False):
    """Run the MoE blocks under the selection policy for one decode step (no nesting)."""
    global _current
    if _current is not None:
        raise RuntimeError("decode_step contexts cannot be nested")
    _current = StepContext(budget=budget, skip_selection=skip_selection)
    try:
        yield _current
    finally:
        _current = None


def current_step() -> StepContext | None:
    return _current


def reset_step() -> None:
    global _current
    _current = None


def find_moe_blocks(model: nn.Module) -> dict[int, nn.Module]:
    """Model layer id -> MoE block (a module with `.gate` and `.experts` holding gate_up_proj)."""
    layers = model.model.layers if hasattr(model, "model") else model.layers
    blocks = {}
    for i, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        experts = getattr(mlp, "experts", None)
        if mlp is not None and hasattr(mlp, "gate") and hasattr(experts, "gate_up_proj"):
            blocks[i] = mlp
    return blocks


def norm_topk_prob(config) -> bool:
    """Whether the model renormalises its top-k weights (Mixtral always does)."""
    if getattr(config, "model_type", "") == "mixtral":
        return True
    return bool(getattr(config, "norm_topk_prob", False))


class MoEPatch:
    """Wraps every MoE block's router of a transformers model; `remove()` restores them."""

    def __init__(self, model: nn.Module, config: SelectionConfig,
                 predictor: Predictor | None = None, use_kernels: bool | str = "auto"):
        self.model = model
        self.config = config
        self.predictor = predictor
        self.blocks = find_moe_blocks(model)
        if not self.blocks:
            raise ValueError(f"model: no MoE blocks found in {type(model).__name__}")
        if predictor is not None:
            predictor.validate(model.config)
        described = describe_model_config(model.config)
        self.num_experts = described["num_experts"]
        self.top_k = described["top_k"]
        self.norm_topk = norm_topk_prob(model.config)
        if getattr(model.config, "_experts_implementation", None) in (None, "eager"):
            # eager experts cannot take the sentinel id; grouped_mm computes the same function
            model.config._experts_implementation = "grouped_mm"
        self.use_kernels = _kernels_usable(model) if use_kernels == "auto" else bool(use_kernels)
        self._select = select_experts
        if self.use_kernels:
            from ..kernels import base_select_experts

            self._select = base_select_experts  # same contract; other policies fall back to the core
        self._originals = {}
        self._experts_originals = {}
        for layer_id, block in self.blocks.items():
            self._originals[layer_id] = block.gate.forward
            block.gate.forward = self._wrap(layer_id, block, block.gate.forward)
            if self.use_kernels:
                self._experts_originals[layer_id] = block.experts.forward
                block.experts.forward = self._wrap_experts(block.experts, block.experts.forward)

    def set_config(self, config: SelectionConfig) -> None:
        self.config = config

    def remove(self) -> None:
        for layer_id, block in self.blocks.items():
            block.gate.forward = self._originals[layer_id]
            if layer_id in self._experts_originals:
                block.experts.forward = self._experts_originals[layer_id]
        self._originals = {}
        self._experts_originals = {}

    def _wrap_experts(self, experts: nn.Module, experts_forward):
        """Decode steps on CUDA: the expert-skipping Triton MoE (sentinel ids become -1 slots)."""
        from ..kernels import fused_moe

        def forward(hidden_states, top_k_index, top_k_weights):
            if _current is None:
                return experts_forward(hidden_states, top_k_index, top_k_weights)
            ids = torch.where(top_k_index >= self.num_experts, torch.full_like(top_k_index, -1),
                              top_k_index)  # [T, K]
            return fused_moe(hidden_states, ids, top_k_weights, experts.gate_up_proj,
                             experts.down_proj)

        return forward

    def _wrap(self, layer_id: int, block: nn.Module, gate_forward):
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
                return out
            x = hidden_states.reshape(-1, hidden_states.shape[-1])  # [T, H]
            norms = None
            if self.config.policy == "oracle":
                ex = block.experts
                norms = expert_output_norms(x, ids, ex.gate_up_proj, ex.down_proj, ex.act_fn)
            sel = self._select(
                logits.reshape(x.shape[0], -1), ids.reshape(x.shape[0], -1),
                weights.reshape(x.shape[0], -1), x, step.budget, layer_id, self.config,
                self.predictor, norm_topk_prob=self.norm_topk, routed_norms=norms)
            step.stats[layer_id] = sel.stats
            step.ids[layer_id] = sel.ids
            sentinel = torch.full_like(sel.ids, self.num_experts)
            exec_ids = torch.where(sel.ids >= 0, sel.ids, sentinel).view_as(ids)
            return logits, sel.weights.view_as(weights), exec_ids

        return forward


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
