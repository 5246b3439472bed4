"""Issue-13 kept-set variants: backfill-aware net loss and per-layer budget schedule.

Small hand-computed cases (true norms through the oracle_* twins, whose costs the test sets exactly),
the predicted-cost versions against the oracle_* ones on a predictor that predicts known norms, and
the fixed-shape contract on meta tensors."""

import math

import pytest
import torch
from core_helpers import make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.core.config import ORACLE_OF, PARTIAL_NATIVE, VARIANTS
from base_sglang.core.variants import scheduled_budget


def kept(sel) -> set[int]:
    return {int(e) for e in sel.ids.flatten() if e >= 0}


# ---- net loss ------------------------------------------------------------------------------
# 3 tokens, 3 experts, top-1 (w = 1), M = 2. Token t routes expert t with true cost c = 1.0, 0.9, 0.8,
# so BASE's D = (1.0, 0.9, 0.8) keeps {0, 1}. Backfill contributions a = (p_b / p_routed)^2 ||E_b||^2:
#   S = {0, 1}: t0 (expert 0 kept) next candidate e1: e^-2 * 0.5^2 = 0.034 -> net(e0) = 0.966
#               t1 (e1 kept)        next candidate e0: e^-1 * 1.2^2 = 0.530 -> net(e1) = 0.370
#               t2 (e2 removed)     its backfill   e0: e^-1 * 0.2^2 = 0.015 -> net(e2) = 0.785
#   so the net loss keeps {0, 2}; with S = {0, 2} the scores are 1.0 - e^-4 0.3^2, 0.370, 0.785 (stable).
NET_LOGITS = torch.tensor([[3.0, 2.0, 1.0], [1.0, 1.5, -5.0], [1.0, -5.0, 1.5]])
NET_IDS = torch.tensor([[0], [1], [2]])
NET_W = torch.ones(3, 1)
NET_NORMS = torch.tensor([[1.0, 0.5, 0.3], [1.2, math.sqrt(0.9), 1.0], [0.2, 1.0, math.sqrt(0.8)]])


def net_select(policy="oracle_net", lam=1.0, iters=2, m=2):
    return select_experts(NET_LOGITS, NET_IDS, NET_W, None, torch.full((3,), m), 0,
                          SelectionConfig(policy=policy, net_lambda=lam, net_iters=iters), None,
                          expert_norms=NET_NORMS)


def test_net_loss_keeps_the_expert_without_a_substitute():
    assert kept(net_select(m=3)) == {0, 1, 2}  # M = union: nothing to choose
    plus = select_experts(NET_LOGITS, NET_IDS, NET_W, None, torch.full((3,), 2), 0,
                          SelectionConfig(policy="oracle", renorm="partial"), None,
                          routed_norms=NET_NORMS.gather(1, NET_IDS))
    assert kept(plus) == {0, 1}  # BASE's objective with true norms
    for iters in (1, 2, 3):
        sel = net_select(iters=iters)
        assert kept(sel) == {0, 2}
        assert sel.ids.flatten().tolist() == [0, 0, 2]  # token 1 is backfilled with expert 0
    # stats report BASE's true D of the removed union expert (expert 1: 0.9)
    assert float(net_select().stats.removed_cost) == pytest.approx(0.9, rel=1e-6)


@pytest.mark.parametrize("lam, want", [(0.0, {0, 1}), (0.1, {0, 1}), (0.5, {0, 2}), (1.0, {0, 2})])
def test_net_lambda_moves_the_choice_where_the_hand_numbers_say(lam, want):
    # net(e1) = 0.9 - lam * 0.530 and net(e2) = 0.8 - lam * 0.0147: they cross at lam = 0.19
    assert kept(net_select(lam=lam)) == want


def test_a_removed_expert_is_discounted_by_the_backfill_that_took_its_slot():
    # t2's first backfill e0 now has norm 2: a = e^-1 * 4 = 1.47 > 0.8, net(e2) = 0, so {0, 1} stays;
    # t2's second candidate (e1, a ~ e^-13) must not be the one used for a removed expert
    norms = NET_NORMS.clone()
    norms[2, 0] = 2.0
    sel = select_experts(NET_LOGITS, NET_IDS, NET_W, None, torch.full((3,), 2), 0,
                         SelectionConfig(policy="oracle_net"), None, expert_norms=norms)
    assert kept(sel) == {0, 1}


def test_net_iterations_reselect_on_the_new_set():
    # M = 1: D keeps {0}; net on S = {0}: t1 and t2 both backfill from e0 (a = 0.530, 0.015), t0 has
    # no candidate: net = (1.0, 0.370, 0.785) -> still {0}
    assert kept(net_select(m=1)) == {0}


def constant_norm_predictor(E, H, K, log_norms):
    """A predictor whose yhat is log_norms[e] for every token (zero weights)."""
    pred = make_predictor(E, H, K)
    pred.weight.zero_()
    pred.bias[0] = torch.as_tensor(log_norms, dtype=torch.float32)
    return pred


@pytest.mark.parametrize("policy", ["net", "sched"])
@pytest.mark.parametrize("M", [2, 4, 6, 9])
def test_predicted_versions_match_their_oracles_when_the_prediction_is_exact(policy, M):
    T, E, K, H = 12, 10, 3, 8
    logits, ids, w = make_routing(T, E, K, seed=3)
    log_n = torch.linspace(-0.5, 0.7, E)
    pred = constant_norm_predictor(E, H, K, log_n)
    pred.layer_budget = torch.tensor([[min(E, 2 * m) for m in range(E + 1)]], dtype=torch.float32)
    hidden = torch.randn(T, H)
    norms = log_n.exp().expand(T, E).contiguous()  # [T, E] the true norms equal the prediction
    b = torch.full((T,), M)
    a = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy=f"base_{policy}"), pred)
    o = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy=f"oracle_{policy}"),
                       pred, expert_norms=norms)
    assert torch.equal(a.ids, o.ids)
    torch.testing.assert_close(a.weights, o.weights)


def test_net_with_zero_lambda_is_base_plus():
    T, E, K, H = 16, 12, 4, 8
    logits, ids, w = make_routing(T, E, K, seed=5)
    hidden = torch.randn(T, H)
    pred = make_predictor(E, H, K, seed=5)
    for M in (3, 5, 8):
        b = torch.full((T,), M)
        a = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_plus"), pred)
        n = select_experts(logits, ids, w, hidden, b, 0,
                           SelectionConfig(policy="base_net", net_lambda=0.0), pred)
        assert torch.equal(a.ids, n.ids) and torch.equal(a.weights, n.weights)


# ---- per-layer schedule --------------------------------------------------------------------
def test_scheduled_budget_reads_the_table_and_keeps_dense():
    E = 6
    table = torch.tensor([0, 1, 3, 2, 6, 5, 6], dtype=torch.float32)
    for m, want in [(0, 0), (1, 1), (2, 3), (3, 2), (4, 6), (5, 5), (6, 6), (9, 9)]:
        assert int(scheduled_budget(torch.tensor(m), table, E)) == want


def test_base_sched_runs_the_layer_budget_of_its_layer():
    T, E, K, H = 16, 12, 4, 8
    logits, ids, w = make_routing(T, E, K, seed=1, skew=0.2)
    hidden = torch.randn(T, H)
    pred = make_predictor(E, H, K, layers=(0, 1), seed=1)
    ident = torch.arange(E + 1, dtype=torch.float32)
    pred.layer_budget = torch.stack([ident, (ident + 2).clamp(max=E)])  # layer 1 gets M + 2
    union = len({int(e) for e in ids.flatten()})
    for M in (2, 4, 7):
        b = torch.full((T,), M)
        plus = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_plus"), pred)
        s0 = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_sched"), pred)
        assert torch.equal(s0.ids, plus.ids) and torch.equal(s0.weights, plus.weights)
        s1 = select_experts(logits, ids, w, hidden, b, 1, SelectionConfig(policy="base_sched"), pred)
        plus2 = select_experts(logits, ids, w, hidden, torch.full((T,), M + 2), 1,
                               SelectionConfig(policy="base_plus"), pred)
        assert int(s1.stats.num_kept) == min(M + 2, union) and torch.equal(s1.ids, plus2.ids)
    dense = select_experts(logits, ids, w, hidden, torch.full((T,), E), 1,
                           SelectionConfig(policy="base_sched"), pred)
    assert torch.equal(dense.ids, ids)


def test_sched_needs_a_table_and_oracles_need_norms():
    T, E, K, H = 4, 6, 2, 8
    logits, ids, w = make_routing(T, E, K)
    pred = make_predictor(E, H, K)
    b = torch.full((T,), 2)
    with pytest.raises(ValueError, match="layer_budget"):
        select_experts(logits, ids, w, torch.randn(T, H), b, 0, SelectionConfig(policy="base_sched"), pred)
    with pytest.raises(ValueError, match="oracle_sched: the predictor file has no 'layer_budget'"):
        select_experts(logits, ids, w, None, b, 0, SelectionConfig(policy="oracle_sched"), pred)
    pred.layer_budget = torch.arange(E + 1, dtype=torch.float32)[None]
    with pytest.raises(ValueError, match="oracle_sched: routed_norms"):
        select_experts(logits, ids, w, None, b, 0, SelectionConfig(policy="oracle_sched"), pred)
    with pytest.raises(ValueError, match="oracle_net: expert_norms"):
        select_experts(logits, ids, w, None, b, 0, SelectionConfig(policy="oracle_net"), pred,
                       routed_norms=torch.ones(T, K))
    with pytest.raises(ValueError, match="max_error"):
        select_experts(logits, ids, w, torch.randn(T, H), b, 0, SelectionConfig(policy="base_net"),
                       pred, max_error=torch.full((T,), 0.1))


@pytest.mark.parametrize("field, value", [("net_lambda", -0.1), ("net_lambda", 1.5), ("net_iters", 0),
                                          ("net_iters", 1.5)])
def test_bad_knobs_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SelectionConfig(policy="base_net", **{field: value})


def test_every_variant_combines_partially_and_has_an_oracle():
    assert set(VARIANTS) <= set(PARTIAL_NATIVE)
    assert all(VARIANTS[o][0] == "true" for p, o in ORACLE_OF.items() if p != "base_plus")
    for p in VARIANTS:
        assert SelectionConfig(policy=p).combine_mode(True) == "partial"
        assert SelectionConfig(policy=p).uses_budget


@pytest.mark.parametrize("policy", sorted(VARIANTS))
def test_variants_run_on_meta_tensors(policy):
    T, E, K, H = 8, 12, 4, 16
    meta = torch.device("meta")
    pred = make_predictor(E, H, K)
    pred.layer_budget = torch.arange(E + 1, dtype=torch.float32)[None]
    pred = pred.to(meta)
    sel = select_experts(
        torch.empty(T, E, device=meta), torch.empty(T, K, dtype=torch.int32, device=meta),
        torch.empty(T, K, device=meta), torch.empty(T, H, device=meta),
        torch.empty(T, dtype=torch.int64, device=meta), 0, SelectionConfig(policy=policy), pred,
        expert_norms=torch.empty(T, E, device=meta))
    assert sel.ids.shape == (T, K) and sel.ids.dtype == torch.int32
    assert sel.stats.num_kept.shape == ()


def test_check_stats_names_the_missing_table():
    from base_sglang.core import SelectionConfig
    from base_sglang.testing.predictors import random_predictor

    pred = random_predictor(8, 16, 0, (0,), num_layers=1, seed=0, architecture="synthetic")
    pred.check_stats("base_plus", SelectionConfig(policy="base_plus").needs_stats, "p.safetensors")
    with pytest.raises(ValueError, match="'base_sched' needs the 'layer_budget' statistics, which "
                                         "p.safetensors lacks"):
        pred.check_stats("base_sched", SelectionConfig(policy="base_sched").needs_stats,
                         "p.safetensors")
    pred.layer_budget = torch.zeros(1, 9)
    pred.check_stats("base_sched", "layer_budget", "p.safetensors")
