"""The hook functions `register()` installs (HookRegistry signatures: see plugin/__init__.py).

Processes: `before_check_server_args` and `before_generate_request` (the budget edge: every budget
is resolved there, once, to an int 1..E) run in the main (HTTP/tokenizer) process; the others in
each scheduler (= TP worker) process, which owns the model and graphs and reads those ints.
"""

from __future__ import annotations

import functools
import logging

import torch

from base_sglang.core import Predictor, PredictorMismatch, SelectionConfig
from base_sglang.core.predictor import describe_model_config

from . import moe, state
from .budget import BUDGET_HEADER, apply_header, token_budgets
from .checks import UnsupportedConfig, check_model_runners, check_server_args
from .compat import is_draft_topk, shared_topk_columns

log = logging.getLogger("base_sglang.plugin")


# ---- main process -------------------------------------------------------------------------------
def before_check_server_args(server_args, *args, **kwargs):
    """ServerArgs.check_server_args BEFORE: Engine and launch_server call it before starting any
    process. (ServerArgs is a msgspec Struct: a hook on its __post_init__ would never run.)"""
    if state.STATE.config_error:
        raise ValueError(state.STATE.config_error)
    if state.STATE.config.enabled:
        check_server_args(server_args)


def before_generate_request(manager, obj, request=None, *args, **kwargs):
    """TokenizerManager.generate_request BEFORE: validate budgets, copy X-Expert-Budget in."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not state.STATE.config.enabled or not isinstance(obj, GenerateReqInput):
        return None
    header = request.headers.get(BUDGET_HEADER) if request is not None else None
    obj.sampling_params = apply_header(obj.sampling_params, header, _num_experts(manager))
    return None


def _num_experts(manager) -> int:
    """E of the served model: its config, else the predictor file's metadata (the same E: the
    predictor is checked against the model when it loads)."""
    cfg = getattr(getattr(manager, "model_config", None), "hf_text_config", None)
    num = describe_model_config(cfg)["num_experts"] if cfg is not None else None
    return int(num) if num else _predictor_experts(state.STATE.config.predictor)


@functools.cache
def _predictor_experts(path: str) -> int:
    import json

    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        return int(json.loads(f.metadata()["base_sglang"])["num_experts"])


# ---- scheduler process: startup -----------------------------------------------------------------
def after_load_model(result, runner, *args, **kwargs):
    """ModelRunner.load_model AFTER: load and validate the predictor of the target model."""
    cfg = state.STATE.config
    if state.STATE.config_error:
        raise ValueError(state.STATE.config_error)
    if not cfg.enabled or runner.is_draft_worker:
        return None
    check_server_args(runner.server_args)
    check_model_runners(runner.model, str(runner.device))
    try:
        predictor = Predictor.load(cfg.predictor)
        predictor.validate(runner.model_config.hf_text_config)
        predictor.check_stats(cfg.policy, SelectionConfig(policy=cfg.policy).needs_stats,
                              f"BASE_PREDICTOR={cfg.predictor}")
    except PredictorMismatch as exc:
        raise PredictorMismatch(f"BASE_PREDICTOR={cfg.predictor}: {exc}") from None
    state.STATE.enable(predictor, cfg, runner.device)
    if cfg.fold:  # the predictor's rows under each router's (plugin/fold.py)
        from .fold import fold_gates

        fold_gates(runner.model, predictor, state.STATE.selection, runner.server_args)
    log.info("BASE: predictor %s loaded (%d MoE layers, E=%d, policy %s, %s)", cfg.predictor,
             len(predictor.meta.moe_layers), predictor.meta.num_experts, cfg.policy,
             state.STATE.select.__name__)
    return None


def before_init_cuda_graphs(runner, *args, **kwargs):
    """ModelRunner.init_cuda_graphs BEFORE: the budget buffer exists before any capture."""
    if state.STATE.enabled and not runner.is_draft_worker:
        state.STATE.ensure_buffer(max(runner.max_running_requests or 1, 1), runner.device)
    return None


def around_decode_capture(original, graph_runner, *args, **kwargs):
    """DecodeCudaGraphRunner.capture AROUND: BASE is captured into target decode graphs only."""
    st = state.STATE
    if (not st.enabled or graph_runner.model_runner.is_draft_worker
            or not graph_runner.capture_forward_mode.is_decode()):
        return original(graph_runner, *args, **kwargs)
    st.ensure_buffer(graph_runner.max_bs, graph_runner.model_runner.device)
    with st.capture():
        return original(graph_runner, *args, **kwargs)


def before_cpu_graph(graph_runner, model_runner, *args, **kwargs):
    """CPUGraphRunner.__init__ BEFORE: its torch.compile capture is not verified with the hook."""
    if state.STATE.enabled and not model_runner.is_draft_worker:
        raise UnsupportedConfig("BASE cannot run inside SGLang's CPU graph runner (torch.compile); "
                                "launch with --cuda-graph-backend-decode disabled")
    return None


# ---- scheduler process: every forward -----------------------------------------------------------
def after_forward_batch_init(forward_batch, cls, batch, model_runner, *args, **kwargs):
    """ForwardBatch.init_new AFTER: attach the decode rows' budgets (a host list) to the batch."""
    if (state.STATE.enabled and not model_runner.is_draft_worker
            and forward_batch.forward_mode.is_decode()):
        st = state.STATE
        forward_batch.base_budgets = token_budgets(batch.reqs, st.default_budget, st.num_experts)
    return None


def around_forward_raw(original, runner, forward_batch, *args, **kwargs):
    """ModelRunner._forward_raw AROUND: fill the buffer and open the gate for decode forwards."""
    st = state.STATE
    if not st.enabled or runner.is_draft_worker or not forward_batch.forward_mode.is_decode():
        return original(runner, forward_batch, *args, **kwargs)
    budgets = getattr(forward_batch, "base_budgets", None)
    if budgets is None:  # built without init_new: default budgets, never stale graph inputs
        budgets = [st.default_budget] * forward_batch.batch_size
    if st.budget is None:  # no init_cuda_graphs call in this runner: eager decode only
        st.ensure_buffer(max(runner.max_running_requests or 1, len(budgets)), runner.device)
    with st.decode_step(budgets):
        return original(runner, forward_batch, *args, **kwargs)


def around_topk(original, topk, hidden_states, router_logits, *args, **kwargs):
    """TopK.forward_{cuda,native,cpu} AROUND. A folded block's gate (plugin/fold.py) returns
    [T, 2E]: in BASE decode steps its routing and selection run from those columns (fold.folded_topk);
    otherwise SGLang's top-k gets the logits, then BASE edits its output (after_topk)."""
    E = getattr(topk, "base_fold", 0)
    if E and router_logits.shape[-1] == 2 * E:
        logits, yhat = router_logits[:, :E], router_logits[:, E:]
        if state.STATE.active and _standard_format(topk):
            from .fold import folded_topk

            return folded_topk(state.STATE, topk, hidden_states, logits, yhat)
        router_logits = logits.contiguous()
    out = original(topk, hidden_states, router_logits, *args, **kwargs)
    new = after_topk(out, topk, hidden_states, router_logits)
    return out if new is None else new


def _standard_format(topk) -> bool:
    """SGLang would return a StandardTopKOutput (not the Triton-kernel or bypassed formats)."""
    fmt = topk.topk_config.output_format
    return fmt is None or fmt.name == "STANDARD"


def after_topk(out, topk, hidden_states, router_logits, *args, **kwargs):
    """BASE on the routed columns of SGLang's standard top-k output (None: leave it as it is)."""
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    st = state.STATE
    if not st.active or is_draft_topk(topk) or type(out) is not StandardTopKOutput:
        return None
    layer = topk.layer_id
    slot = st.predictor._slot.get(layer)
    if slot is None:
        return None
    n = hidden_states.shape[0]
    k = topk.topk_config.top_k - shared_topk_columns(topk.topk_config)  # routed columns
    ids, w = out.topk_ids[:, :k], out.topk_weights[:, :k]  # [T, K]
    sel = st.select(router_logits, ids, w, hidden_states, st.budget[:n], layer,
                    st.selection, st.predictor, norm_topk_prob=topk.topk_config.renormalize)
    st.record(slot, sel.stats.num_union, sel.stats.num_kept)
    if st.sel_trace is not None:  # BASE_SELECTION_TRACE (TP agreement checks)
        st.sel_trace.keep(slot, sel.ids, sel.weights)
    new_ids, new_w = sel.ids, sel.weights
    if k < out.topk_ids.shape[1]:  # fused shared-expert slots stay as they are
        new_ids = torch.cat([new_ids, out.topk_ids[:, k:]], dim=1)  # [T, K + shared]
        new_w = torch.cat([new_w, out.topk_weights[:, k:]], dim=1)
    return out._replace(topk_ids=new_ids, topk_weights=new_w)



def around_fused_experts(original, *args, **kwargs):
    """fused_experts_impl AROUND: in BASE decode steps the MoE must skip -1 slots.

    With BASE_MOE=auto (the default) a plain call of at most BASE_MOE_MAX_ROWS rows (default 64), on
    a GPU with tuned tiles for its shape, runs our fused_moe (plugin/moe.py), which skips them by
    design.
    Otherwise SGLang's Triton MoE runs with filter_expert forced on: SGLang 0.5.17 skips a -1 block
    only with filter_expert=True, which it passes only under expert parallelism (num_experts !=
    num_local_experts); without it the GEMM reads the weights of expert -1 (an illegal address,
    seen on the H200). 0.5.23 always skips them. Outside BASE's decode steps the call is left as
    SGLang made it.
    """
    st = state.STATE
    if not st.active:
        return original(*args, **kwargs)
    sig = moe.signature()
    bound = sig.bind(*args, **kwargs)
    if st.config.moe == "auto" and st.config.kernels:
        reason = moe.why_not_ours(bound.arguments, sig, st.config.moe_max_rows)
        if reason is None:
            return moe.run_ours(bound.arguments)
        st.note_sglang_moe(reason)
    bound.arguments["filter_expert"] = True
    return original(*bound.args, **bound.kwargs)
