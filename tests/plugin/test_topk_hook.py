"""The TopK hook inside real sglang: entry-point discovery, equality with the core, pass-through."""

from __future__ import annotations

import pkgutil

import pytest
import torch
from plugin_helpers import NUM_LAYERS, E, H, K, forward_batch, make_predictor, model_runner

from base_sglang.core import DEFAULT_POLICY, SelectionConfig, select_experts
from base_sglang.plugin import TARGETS, hooks


def test_load_plugins_discovers_entry_point_and_applies_every_hook(plugin_env):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert plugin_env["patched_by_import"] is False  # importing base_sglang.plugin patched nothing
    missing = [t for t, _, _ in TARGETS if t not in HookRegistry._patched]
    assert missing == []  # every target exists in this sglang (0.5.17 .. 0.5.23) and was wrapped
    for target, _hook, _ in TARGETS:
        owner, attr = target.rsplit(".", 1)
        assert hasattr(getattr(pkgutil.resolve_name(owner), attr), "__wrapped__"), target
    assert isinstance(ForwardBatch.__dict__["init_new"], classmethod)


def _topk(layer_id=1, renormalize=True, is_draft=False):
    """A real TopK; None for a draft one where sglang has no draft mark on TopK (0.5.17, whose
    drafts are told apart by ModelRunner.is_draft_worker alone)."""
    import inspect

    from sglang.srt.layers.moe.topk import TopK

    if "is_draft" not in inspect.signature(TopK.__init__).parameters:
        return None if is_draft else TopK(top_k=K, layer_id=layer_id, renormalize=renormalize)
    return TopK(top_k=K, layer_id=layer_id, renormalize=renormalize, is_draft=is_draft)


def _inputs(T, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, H, generator=g), torch.randn(T, E, generator=g)  # [T, H], [T, E]


def _core(st, dense, hidden, logits, budgets, layer_id, renormalize=True, policy=DEFAULT_POLICY):
    T = hidden.shape[0]
    b = torch.tensor(list(budgets) + [-1] * (T - len(budgets)))  # [T] padded rows -1
    return select_experts(logits, dense.topk_ids, dense.topk_weights, hidden, b, layer_id,
                          SelectionConfig(policy=policy), st.predictor, norm_topk_prob=renormalize)


@pytest.mark.parametrize("budgets, T", [
    ([2, 2, 2, 2, 2, 2], 6),  # uniform small budget
    ([1, 3, 2, 8, 1], 8),  # mixed budgets (one dense -> batch dense) + 3 padded graph rows
    ([1, 2, 1, 1], 6),  # mixed small budgets + 2 padded rows
    ([3], 1),  # batch of one
])
@pytest.mark.parametrize("renormalize", [True, False])
def test_forward_native_equals_core(base_state, budgets, T, renormalize):
    topk = _topk(layer_id=1, renormalize=renormalize)
    hidden, logits = _inputs(T, seed=len(budgets) + T)
    dense = topk.forward_native(hidden, logits)  # gate closed: SGLang's own output
    with base_state.decode_step(budgets) as on:
        assert on
        out = topk(hidden, logits)  # through BaseFusedOp dispatch, as the model calls it
    want = _core(base_state, dense, hidden, logits, budgets, 1, renormalize)
    assert out.topk_ids.dtype == dense.topk_ids.dtype
    assert torch.equal(out.topk_ids, want.ids)
    torch.testing.assert_close(out.topk_weights, want.weights, rtol=0, atol=0)
    assert torch.equal(out.router_logits, logits)
    n = len(budgets)
    assert (out.topk_ids[n:] == -1).all() and (out.topk_weights[n:] == 0).all()  # padded rows
    kept = torch.unique(out.topk_ids[out.topk_ids >= 0])
    assert kept.numel() <= (E if max(budgets) >= E else max(budgets))
    assert int(base_state.num_kept[1]) == kept.numel()  # per-layer counter of executed experts
    assert int(base_state.num_union[1]) == torch.unique(dense.topk_ids[:n]).numel()


@pytest.mark.parametrize("renormalize", [True, False])
def test_default_policy_is_base_plus_with_partial_weights(base_state, renormalize):
    """BASE_POLICY unset: the hook runs base_plus, whose changed rows carry the partial weights
    (BASE's "never" weights times (W / their sum) ** 0.5), not the paper's BASE weights."""
    assert base_state.config.policy == DEFAULT_POLICY == "base_plus"
    assert base_state.selection == SelectionConfig(policy="base_plus", renorm="native")
    topk = _topk(renormalize=renormalize)
    hidden, logits = _inputs(6, seed=21)
    dense = topk.forward_native(hidden, logits)
    with base_state.decode_step([2] * 6):
        out = topk(hidden, logits)
    base = _core(base_state, dense, hidden, logits, [2] * 6, 1, renormalize, policy="base")
    never = select_experts(logits, dense.topk_ids, dense.topk_weights, hidden,
                           torch.full((6,), 2), 1, SelectionConfig(policy="base", renorm="never"),
                           base_state.predictor)
    assert torch.equal(out.topk_ids, base.ids)  # same kept set and backfill as BASE
    changed = (out.topk_ids != dense.topk_ids).any(1)  # [T]
    assert changed.any()
    w0 = dense.topk_weights.sum(1)  # [T] the token's original total weight W
    partial = never.weights * (w0 / never.weights.sum(1)).sqrt()[:, None]  # [T, K]
    torch.testing.assert_close(out.topk_weights[changed], partial[changed], rtol=1e-6, atol=1e-7)
    if renormalize:  # BASE renormalises to W, base_plus only half-way (in log space)
        assert not torch.allclose(out.topk_weights[changed], base.weights[changed])
    assert torch.equal(out.topk_weights[~changed], dense.topk_weights[~changed])


def test_small_budget_changes_the_routing(base_state):
    """Guard that the equality test above is not vacuous: budget 1 really drops experts."""
    topk = _topk()
    hidden, logits = _inputs(8, seed=3)
    dense = topk.forward_native(hidden, logits)
    with base_state.decode_step([1] * 8):
        out = topk(hidden, logits)
    assert torch.unique(dense.topk_ids).numel() > 1
    assert torch.unique(out.topk_ids[out.topk_ids >= 0]).numel() == 1


def _through_forward_raw(st, runner, fb, topk, hidden, logits):
    """Run one TopK call inside the real _forward_raw hook (the model forward reduced to TopK)."""
    return hooks.around_forward_raw(lambda r, b: topk(hidden, logits), runner, fb)


@pytest.mark.parametrize("mode", ["EXTEND", "MIXED", "TARGET_VERIFY", "DRAFT_EXTEND_V2", "SPLIT_PREFILL"])
def test_non_decode_forwards_pass_through(base_state, mode):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    topk = _topk()
    hidden, logits = _inputs(6)
    dense = topk.forward_native(hidden, logits)
    fb = forward_batch(getattr(ForwardMode, mode), 6)
    fb.base_budgets = [1] * 6  # even with budgets attached, only DECODE opens the gate
    out = _through_forward_raw(base_state, model_runner(), fb, topk, hidden, logits)
    assert torch.equal(out.topk_ids, dense.topk_ids)
    assert torch.equal(out.topk_weights, dense.topk_weights)
    assert not base_state.active


def test_decode_forward_applies_and_draft_passes_through(base_state):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    hidden, logits = _inputs(6)
    topk = _topk()
    dense = topk.forward_native(hidden, logits)
    fb = forward_batch(ForwardMode.DECODE, 6)
    fb.base_budgets = [1] * 6
    out = _through_forward_raw(base_state, model_runner(), fb, topk, hidden, logits)
    want = _core(base_state, dense, hidden, logits, [1] * 6, 1)
    assert torch.equal(out.topk_ids, want.ids)
    # a draft model's runner, and a draft model's TopK inside a target decode step: unchanged
    out = _through_forward_raw(base_state, model_runner(is_draft_worker=True), fb, topk, hidden,
                               logits)
    assert torch.equal(out.topk_ids, dense.topk_ids)
    draft = _topk(is_draft=True)
    if draft is not None:  # sglang >= 0.5.18 marks a draft model's TopK
        out = _through_forward_raw(base_state, model_runner(), fb, draft, hidden, logits)
        assert torch.equal(out.topk_ids, dense.topk_ids)


def test_layer_outside_the_predictor_passes_through(base_state):
    topk = _topk(layer_id=5)  # the predictor covers layers 0 and 1
    hidden, logits = _inputs(4)
    dense = topk.forward_native(hidden, logits)
    with base_state.decode_step([1] * 4):
        out = topk(hidden, logits)
    assert torch.equal(out.topk_ids, dense.topk_ids)


def test_decode_capture_opens_the_gate_for_target_decode_graphs_only(base_state):
    """DecodeCudaGraphRunner.capture AROUND: on for target DECODE capture, off otherwise."""
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def graph_runner(mode, draft=False, max_bs=32):  # stand-in: the attributes the hook reads
        return SimpleNamespace(capture_forward_mode=mode, max_bs=max_bs,
                               model_runner=model_runner(is_draft_worker=draft))

    seen = lambda gr: base_state.active  # what a TopK call inside the capture would see
    assert hooks.around_decode_capture(seen, graph_runner(ForwardMode.DECODE)) is True
    assert base_state.budget.numel() >= 32  # grown to the largest captured batch before capture
    assert (base_state.budget == -1).all()  # capture leaves the buffer as padding
    assert hooks.around_decode_capture(seen, graph_runner(ForwardMode.TARGET_VERIFY)) is False
    assert hooks.around_decode_capture(seen, graph_runner(ForwardMode.DECODE, draft=True)) is False
    assert not base_state.active


def test_revert_restores_sglang_and_register_reapplies(base_state):
    from sglang.srt.layers.moe.topk import TopK
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.plugins.hook_registry import HookRegistry

    from base_sglang.plugin import register, revert

    wrapped = TopK.forward_native
    try:
        assert sorted(revert()) == sorted(t for t, _, _ in TARGETS)
        assert not hasattr(TopK.forward_native, "__wrapped__")
        assert TopK.forward_native is wrapped.__wrapped__
        assert isinstance(ForwardBatch.__dict__["init_new"], classmethod)
        hidden, logits = _inputs(4)
        dense = _topk().forward_native(hidden, logits)
        with base_state.decode_step([1] * 4):  # gate open, but nothing is hooked any more
            assert torch.equal(_topk()(hidden, logits).topk_ids, dense.topk_ids)
    finally:
        register()
        HookRegistry.apply_hooks()
    assert all(t in HookRegistry._patched for t, _, _ in TARGETS)
    assert hasattr(TopK.forward_native, "__wrapped__")


def test_fused_moe_skips_dropped_slots_in_base_steps(base_state):
    """SGLang 0.5.17's Triton MoE reads expert -1's weights unless filter_expert=True (it passes
    True only under EP): a BASE step's call that our fused_moe does not take (here: CPU tensors
    without the Triton interpreter) runs SGLang's kernel with the flag forced; other calls are
    passed through untouched."""
    import inspect

    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    sig = inspect.signature(fused_moe.fused_experts_impl)
    calls = []

    def original(*args, **kwargs):  # records what SGLang's kernel would have been given
        calls.append(sig.bind(*args, **kwargs).arguments)
        return "sglang"

    x, w1, w2, w, ids = (torch.zeros(1) for _ in range(5))
    call = sig.bind(x, w1, w2, w, ids, filter_expert=False)
    assert hooks.around_fused_experts(original, *call.args, **call.kwargs) == "sglang"
    assert calls[-1]["filter_expert"] is False  # not a BASE step: as SGLang made it
    import dataclasses

    for moe in ("sglang", "auto"):  # the default, then ours where plain (not these CPU tensors)
        base_state.config = dataclasses.replace(base_state.config, moe=moe)
        with base_state.decode_step([2]):
            assert hooks.around_fused_experts(original, *call.args, **call.kwargs) == "sglang"
            assert calls[-1]["filter_expert"] is True
        assert any("hidden_states" in r for r in base_state.sglang_moe_reasons) == (moe == "auto")


def _plain_call(T=3, E=6, H=32, I=16, dtype=torch.bfloat16, **extra):  # noqa: E741
    import inspect

    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe

    sig = inspect.signature(fused_moe.fused_experts_impl)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, generator=g).to(dtype)
    w1 = torch.randn(E, 2 * I, H, generator=g).to(dtype)
    w2 = torch.randn(E, H, I, generator=g).to(dtype)
    ids = torch.tensor([[0, 2], [1, -1], [5, 2]], dtype=torch.int32)[:T]
    w = torch.rand(T, 2, generator=g)
    return sig, sig.bind(x, w1, w2, w, ids, **extra).arguments


@pytest.mark.parametrize("extra, reason", [
    ({}, None),
    (dict(inplace=True, filter_expert=False, routed_scaling_factor=1.0), None),
    (dict(activation="gelu"), "activation"),
    (dict(apply_router_weight_on_input=True), "apply_router_weight_on_input"),
    (dict(use_fp8_w8a8=True), "use_fp8_w8a8"),
    (dict(no_combine=True), "no_combine"),
    (dict(routed_scaling_factor=2.5), "routed_scaling_factor"),
    (dict(b1=torch.zeros(6, 32)), "b1"),
])
def test_which_fused_experts_calls_run_ours(extra, reason, monkeypatch):
    """Ours only where it computes the call exactly: silu, gated, no bias / quantisation / scaling,
    every argument it does not read at its default (checked against the real signature)."""
    from base_sglang.plugin import moe

    monkeypatch.setattr(moe, "_interpreter", lambda: True)  # these CPU tensors stand for CUDA ones
    sig, args = _plain_call(**extra)
    got = moe.why_not_ours(args, sig)
    assert (got is None) if reason is None else (got is not None and reason in got), got
    sig, args = _plain_call(dtype=torch.float32)
    assert "hidden_states" in moe.why_not_ours(args, sig)
    monkeypatch.setattr(moe, "_interpreter", lambda: False)
    sig, args = _plain_call()
    assert "cpu" in moe.why_not_ours(args, sig)  # CPU tensors outside the interpreter: SGLang's
    monkeypatch.setattr(moe, "_interpreter", lambda: True)
    sig, args = _plain_call()
    args = dict(args, hidden_states=torch.zeros(moe.OURS_MAX_TOKENS + 1, 32, dtype=torch.bfloat16))
    assert "rows" in moe.why_not_ours(args, sig)  # larger batches: SGLang's kernel
    sig, args = _plain_call()  # 3 rows; BASE_MOE_MAX_ROWS moves the limit
    assert moe.why_not_ours(args, sig, max_rows=3) is None
    assert "more than 2 rows" in moe.why_not_ours(args, sig, max_rows=2)


def test_ours_only_where_tuned_tiles_exist():
    """BASE_MOE=auto runs our fused_moe only where kernels/configs has a budget row of the GPU and
    shape at that row count (the shipped NVIDIA_H200.json: three shapes, T = 1..128, which the
    H100 80GB HBM3's file borrows); any other GPU, shape or row count keeps SGLang's kernel, with
    the reason."""
    from base_sglang.plugin import moe

    qwen3 = (128, 2048, 768, 8)
    for T in (1, 3, 16):
        assert moe.untuned("NVIDIA H200", *qwen3, T) is None
    assert moe.untuned("NVIDIA H200", 64, 2048, 1024, 8, 8) is None  # OLMoE
    for T in (1, 16, 64):
        assert moe.untuned("NVIDIA H100 80GB HBM3", *qwen3, T) is None  # same_as: the H200's rows
    for T in (1, 16):  # no file for this GPU: one reason (one log line) for every T
        assert moe.untuned("NVIDIA H100 PCIe", *qwen3, T) == \
            "no tuned fused_moe rows for NVIDIA H100 PCIe E=128,H=2048,I=768,K=8"
    assert "E=96" in moe.untuned("NVIDIA H200", 96, 2048, 768, 8, 16)
    assert "T=129" in moe.untuned("NVIDIA H200", *qwen3, 129)  # above the largest tuned T
    assert moe.untuned(None, *qwen3, 16) is not None


def test_plain_base_step_runs_our_fused_moe_through_the_hook(base_state):
    """The whole AROUND hook in a BASE step with BASE_MOE=auto and our kernel on the Triton CPU
    interpreter (a fresh process: TRITON_INTERPRET must be set before the kernels are imported):
    == the core MoE, dropped slot skipped, inplace writes hidden_states (BASE_MOE=auto is the
    default); BASE_MOE=sglang leaves it to SGLang's kernel."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import dataclasses, inspect, torch
        from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe as sgl
        from base_sglang.core import moe_forward_ref
        from base_sglang.plugin import hooks, state
        sig = inspect.signature(sgl.fused_experts_impl)
        g = torch.Generator().manual_seed(0)
        T, E, H, I = 3, 6, 32, 16
        x = torch.randn(T, H, generator=g).bfloat16()
        w1 = (torch.randn(E, 2 * I, H, generator=g) * H ** -0.5).bfloat16()
        w2 = (torch.randn(E, H, I, generator=g) * I ** -0.5).bfloat16()
        ids = torch.tensor([[0, 2], [1, -1], [5, 2]], dtype=torch.int32)
        w = torch.rand(T, 2, generator=g)
        ref = moe_forward_ref(x.float(), ids.long(), w, w1.float(), w2.float())
        def original(*a, **k):
            raise SystemExit("SGLang's kernel was called")
        state.STATE.active = True
        assert state.STATE.config.moe == "auto"  # the default
        y = hooks.around_fused_experts(original, x, w1, w2, w, ids)
        rel = ((y.float() - ref).norm() / ref.norm()).item()
        assert y.shape == (T, H) and rel < 1e-2, rel
        x2 = x.clone()
        out = hooks.around_fused_experts(original, x2, w1, w2, w, ids, inplace=True)
        assert out.data_ptr() == x2.data_ptr() and torch.equal(x2, y)
        state.STATE.config = dataclasses.replace(state.STATE.config, moe="sglang")
        called = []
        hooks.around_fused_experts(lambda *a, **k: called.append(sig.bind(*a, **k).arguments),
                                   x, w1, w2, w, ids)
        assert called and called[0]["filter_expert"] is True
        print("ok", rel)
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]


def test_base_sched_runs_the_table_of_the_graph_batch_size(base_state):
    """base_sched with one table per batch-size range: the hook hands the selection every row of
    the forward (under CUDA graphs the captured batch size, padding rows included), so the range
    is picked by that row count, which is what the kernels see, not by the real requests."""
    import dataclasses

    pred = make_predictor()
    table = torch.arange(E + 1, dtype=torch.float32).repeat(3, NUM_LAYERS, 1)  # [R, L, E+1]
    table[:, 1, 1] = torch.tensor([1.0, 3.0, 5.0])  # layer 1 at M = 1: rows 1-2, 3-4, 5+
    pred.layer_budget, pred.layer_budget_max_batch = table, torch.tensor([2.0, 4.0])
    base_state.enable(pred, dataclasses.replace(base_state.config, policy="base_sched"), "cpu")
    topk = _topk(layer_id=1)
    for n, T, want, by_real_rows in [(2, 2, 1, 1), (2, 8, 5, 1), (3, 4, 3, 3), (6, 8, 5, 5),
                                     (1, 3, 3, 1)]:
        hidden, logits = _inputs(T, seed=10 * n + T)
        dense = topk.forward_native(hidden, logits)
        with base_state.decode_step([1] * n) as on:
            assert on
            out = topk(hidden, logits)
        want_sel = _core(base_state, dense, hidden, logits, [1] * n, 1, policy="base_sched")
        assert torch.equal(out.topk_ids, want_sel.ids)
        torch.testing.assert_close(out.topk_weights, want_sel.weights, rtol=0, atol=0)
        union = torch.unique(dense.topk_ids[:n]).numel()
        kept = torch.unique(out.topk_ids[out.topk_ids >= 0]).numel()
        assert kept == min(want, union), (n, T)
        if by_real_rows != want:  # the case tells the two row counts apart
            assert min(by_real_rows, union) != kept


@pytest.mark.parametrize("renormalize", [True, False])
def test_base_fold_through_the_hook_equals_the_core(base_state, renormalize):
    """BASE_POLICY=base_fold (selectable, not the default): the TopK hook gives exactly the core's
    selection, which reads the predictor's ExFold statistics on the model's device; the step keeps
    at most the budget, and differs from base_plus where a dropped slot is folded."""
    import dataclasses

    from base_sglang.testing.predictors import random_predictor

    pred = random_predictor(E, H, K, range(NUM_LAYERS), seed=0, scale=0.5, model_id="tiny-test",
                            stats=True)  # with ExFold's coef / loss
    base_state.enable(pred, dataclasses.replace(base_state.config, policy="base_fold"), "cpu")
    topk = _topk(layer_id=1, renormalize=renormalize)
    hidden, logits = _inputs(6, seed=3)
    dense = topk.forward_native(hidden, logits)
    with base_state.decode_step([2] * 6) as on:
        assert on
        out = topk(hidden, logits)
    want = _core(base_state, dense, hidden, logits, [2] * 6, 1, renormalize, policy="base_fold")
    assert torch.equal(out.topk_ids, want.ids)
    torch.testing.assert_close(out.topk_weights, want.weights, rtol=0, atol=0)
    assert torch.unique(out.topk_ids[out.topk_ids >= 0]).numel() <= 2
    plus = _core(base_state, dense, hidden, logits, [2] * 6, 1, renormalize, policy="base_plus")
    assert not torch.equal(out.topk_weights, plus.weights)
