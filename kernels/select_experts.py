"""`base_select_experts`: the Triton path of `base_sglang.core.select_experts`.

Same signature and semantics as the core for policies "base", "base_plus" and "base_sched" (ids
exact, weights to float rounding; base_sched is base_plus with the layer's scheduled budget, read
in-kernel from the [E+1] row of the predictor's layer_budget table that the host picks, as the core
does, by the batch-size range of the T rows of the call: under CUDA graphs the captured batch
size). Two kernels do it, chosen by shape (graph-safe):
  E >= FUSED_MIN_E and T <= FUSED_MAX_T  `base_fused_select`: scoring, grid barrier, batch score,
                    top-M, backfill and weights in one cooperative launch;
  otherwise         base_score then base_select (two launches, pair-parallel scoring), which
                    measured faster on the H200 at larger T (per-expert scoring is imbalanced under
                    skewed routing) and at fewer experts (OLMoE's 64, Mixtral's 8).
BASE_SELECT_KERNEL=fused|two forces one of them (benchmarks). The combine rule is
config.combine_mode(norm_topk_prob) ("always", "never" or "partial" with config.renorm_alpha), so
base_plus and base with any renorm mode run here. Other policies, base_sched without a table,
layers listed in config.skip_layers and calls with max_error (error-targeted budgets) run the
core's torch path, which is also fixed-shape and graph-capturable. Missing inputs raise the core's
errors.

`route_select_experts` is the folded form (core/routing.py): the router's logits and the predictor's
dot products from one stacked GEMM, the router's top-k and the selection in one launch
(kernels/base_route.py) or two (kernels/base_route_split.py: each program routes its own rows
once); `route_mode` says which of those, or the router's top-k launch followed by
base_select_experts ("unfold"), the plugin's folded blocks run.
"""

from __future__ import annotations

import os

import torch

from base_sglang.core import Predictor, Selection, SelectionConfig, SelectionStats, select_experts
from base_sglang.kernels import ROUTE_MODES, SELECT_KERNELS
from base_sglang.kernels.base_fused import base_fused_select
from base_sglang.kernels.base_route import base_route_select
from base_sglang.kernels.base_route_split import base_route_split
from base_sglang.kernels.base_score import base_score
from base_sglang.kernels.base_select import base_select
from base_sglang.kernels.fused_moe import device_name
from base_sglang.kernels.moe_configs import route_split_min_t
from base_sglang.kernels.utils import is_interpreter

FUSED_MAX_T = 32  # measured on the H200 (BENCHMARKS.md, "Scoring + selection per MoE layer")
FUSED_MIN_E = 96
# same kept set and backfill; base and base_plus differ in the combine rule, base_sched is base_plus
# with this layer's budget read from the predictor's per-layer schedule (layer_budget)
KERNEL_POLICIES = ("base", "base_plus", "base_sched")
SPLIT_MIN_T = 32  # below, one launch, on a GPU whose file has no route_split_min_t (moe_configs);
# the H100 and H200 files both say 8, measured on each
SPLIT_MAX_T = 128  # the largest decode batch the two-launch route-select was timed at (H200)


def selection_kernel(T: int, E: int) -> str:
    """"fused" or "two" for a batch of T rows over E experts (BASE_SELECT_KERNEL overrides)."""
    forced = os.environ.get("BASE_SELECT_KERNEL", "")
    if forced:
        if forced not in SELECT_KERNELS:
            raise ValueError(f"BASE_SELECT_KERNEL: must be 'fused' or 'two', got {forced!r}")
        return forced
    return "fused" if T <= FUSED_MAX_T and E >= FUSED_MIN_E else "two"


def base_select_experts(
    router_logits: torch.Tensor,  # [T, E]
    topk_ids: torch.Tensor,  # [T, K] int32/int64
    topk_weights: torch.Tensor,  # [T, K]
    hidden_states: torch.Tensor | None,  # [T, H]
    budget: torch.Tensor,  # [T] int, -1 padded row, >= E dense (keep it on the device for graphs)
    layer_id: int,
    config: SelectionConfig,
    predictor: Predictor | None = None,
    *,
    norm_topk_prob: bool = True,
    routed_norms: torch.Tensor | None = None,
    max_error: torch.Tensor | None = None,  # [T] error bounds: error-targeted budgets run the core
) -> Selection:
    """Turn the router's top-k into what one MoE layer executes in one decode step (Triton)."""
    use_core = (config.policy not in KERNEL_POLICIES or layer_id in config.skip_layers
                or predictor is None or hidden_states is None or layer_id not in predictor._slot
                or max_error is not None
                or (config.policy == "base_sched" and predictor.layer_budget is None))
    if use_core:
        return select_experts(router_logits, topk_ids, topk_weights, hidden_states, budget, layer_id,
                              config, predictor, norm_topk_prob=norm_topk_prob,
                              routed_norms=routed_norms, max_error=max_error)
    dev = router_logits.device
    j = predictor.slot(layer_id)
    a = predictor.weight[j].to(dev)  # [E, H] no copy when the predictor already lives on dev
    b = predictor.bias[j].to(dev)  # [E]
    if budget.device != dev or budget.dtype not in (torch.int32, torch.int64):
        budget = budget.to(dev, torch.int64)
    ids = topk_ids.contiguous()
    w = topk_weights.contiguous()
    table = None  # [E+1] this layer's schedule (base_sched)
    if config.policy == "base_sched":
        # the core's pick: the table of the batch-size range of T = ids.shape[0] rows (predictor.py)
        table = predictor.layer_schedule(layer_id, ids.shape[0]).to(dev, torch.float32).contiguous()
    kw = dict(backfill=config.backfill, combine=config.combine_mode(norm_topk_prob),
              alpha=config.renorm_alpha, table=table)
    if selection_kernel(ids.shape[0], router_logits.shape[1]) == "two":
        cost = base_score(hidden_states, ids, w, budget.contiguous(), a, b)  # [T, K]
        new_ids, new_w, _d, _in_s, counts, removed = base_select(
            cost, ids, w, router_logits, budget.contiguous(), **kw)
    else:
        new_ids, new_w, _d, _in_s, counts, removed = base_fused_select(
            hidden_states, ids, w, router_logits, budget.contiguous(), a, b, **kw)
    return Selection(new_ids, new_w, SelectionStats(counts[0], counts[1], removed[0]))


def route_mode(T: int, E: int, gpu: str | None = None) -> str:
    """How a folded block routes + selects T rows over E experts on GPU `gpu` (its name, or None):
    "fold" (one route-select launch, kernels/base_route.py), "split" (the same in two launches,
    kernels/base_route_split.py) or "unfold" (the router's top-k launch, then base_select_experts),
    by what measured fastest (BENCHMARKS.md, eighth to tenth sessions' kernel sections, and
    "The two-launch route-select from 8 rows on the H100"):
      fold   T < the GPU file's route_split_min_t (moe_configs.route_split_min_t), else
             T < SPLIT_MIN_T (32, a GPU without measurements of its own). On the H100 80GB HBM3
             (its file: 8) the two launches are faster alone at T = 8 / 16 (3.9 / 3.0 against
             4.3 / 5.3 us added to the router GEMM) and took less GPU time per decode step at B = 16
             in two A/B pairs (-0.04 / -0.08 ms). On the H200 (its file: 8, the rerun at 6a99562)
             they take 10.6 / 10.6 us at T = 8 / 16 against the one launch's 11.6 / 13.1, and were
             not slower end to end in any B = 8 / 16 cell of a fold/split/split/fold run (an
             earlier H200 profile at B = 16 had them 1.1 us busier per layer; the rerun's profile
             had them 0.8 us less busy).
      split  from there to SPLIT_MAX_T (H200, T = 64: 11.3 against 25.5 / 26.5 us folded /
             unfolded, 7.2 % faster end to end than unfolded at B = 64; T = 128: 11.8 against 35.1
             unfolded; at B = 32 end to end within noise of the one launch).
      unfold above (not measured there).
    The split's two parts in one cooperative launch with a grid barrier between them (commit
    440a2ca) were slower than the two launches at every T on an H100 (Qwen3 T = 16: 11.8 against
    10.7 us) and no faster end to end at B = 16, so that launch was removed (BENCHMARKS.md,
    "The joined route-select").
    BASE_ROUTE=fold|split|unfold overrides it (benchmarks); auto or unset: the rule."""
    forced = os.environ.get("BASE_ROUTE", "")
    if forced and forced != "auto":
        if forced not in ROUTE_MODES:
            raise ValueError(f"BASE_ROUTE: must be one of {', '.join(ROUTE_MODES)}, got {forced!r}")
        return forced
    if T < (route_split_min_t(gpu) or SPLIT_MIN_T):
        return "fold"
    return "split" if T <= SPLIT_MAX_T else "unfold"


def route_wins(T: int, E: int) -> bool:
    """Whether a folded block runs route_select_experts (fold or split) for T rows over E experts,
    rather than the router's top-k launch + the unfolded selection (route_mode)."""
    return route_mode(T, E) != "unfold"


def route_foldable(config: SelectionConfig, layer_id: int, predictor: Predictor | None) -> bool:
    """Whether this layer's routing + selection can run from a folded router GEMM (core.routing):
    a kernel policy on a layer the predictor covers (base_sched: with its table)."""
    return (config.policy in KERNEL_POLICIES and layer_id not in config.skip_layers
            and predictor is not None and layer_id in predictor._slot
            and not (config.policy == "base_sched" and predictor.layer_budget is None))


def route_select_experts(
    logits: torch.Tensor,  # [T, E] router logits (the folded GEMM's first E columns)
    yhat: torch.Tensor,  # [T, E] z . a_e (its next E columns, no bias)
    budget: torch.Tensor,  # [T] int on the device (select_experts' semantics)
    layer_id: int,
    config: SelectionConfig,
    predictor: Predictor,
    *,
    top_k: int,
    norm_topk_prob: bool,
    ids_dtype: torch.dtype = torch.int32,
) -> Selection:
    """The router's softmax top-k + BASE in one launch (kernels.base_route), or in two where
    route_mode says "split" (kernels.base_route_split); CPU: core.routing."""
    from base_sglang.core.routing import route_select

    if not route_foldable(config, layer_id, predictor):
        raise ValueError(f"route_select_experts: policy {config.policy!r} at layer {layer_id} does "
                         f"not run from a folded router (route_foldable)")
    dev = logits.device
    if dev.type != "cuda" and not is_interpreter():
        sel, _, _ = route_select(logits, yhat, budget, layer_id, config, predictor, top_k=top_k,
                                 norm_topk_prob=norm_topk_prob)
        return Selection(sel.ids.to(ids_dtype), sel.weights, sel.stats)
    j = predictor.slot(layer_id)
    b = predictor.bias[j].to(dev)  # [E]
    if budget.device != dev or budget.dtype not in (torch.int32, torch.int64):
        budget = budget.to(dev, torch.int64)
    table = None
    if config.policy == "base_sched":
        table = predictor.layer_schedule(layer_id, logits.shape[0]).to(dev, torch.float32).contiguous()
    split = route_mode(logits.shape[0], logits.shape[1], device_name(dev)) == "split"
    launch = base_route_split if split else base_route_select
    ids, w, counts, removed = launch(
        logits, yhat, b, budget.contiguous(), top_k=top_k, renormalize=norm_topk_prob,
        backfill=config.backfill, combine=config.combine_mode(norm_topk_prob),
        alpha=config.renorm_alpha, table=table, ids_dtype=ids_dtype)
    return Selection(ids, w, SelectionStats(counts[0], counts[1], removed[0]))
