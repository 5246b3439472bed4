"""Baseline policies against loop-based readings of ../shared/docs/algorithms.md."""

import pytest
import torch
from core_helpers import backfill_ref, make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 10, 9, 3, 8


def setup(seed=0):
    logits, ids, w = make_routing(T, E, K, seed=seed)
    return logits, ids, w, torch.randn(T, H), make_predictor(E, H, K, seed=seed)


def call(policy, budget, seed=0, **kw):
    logits, ids, w, hidden, pred = setup(seed)
    b = torch.full((T,), budget)
    return select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy=policy, **kw), pred), \
        (logits, ids, w, hidden, pred)


@pytest.mark.parametrize("k0", [1, 2])
def test_oea_piggybacks_inside_the_union_of_top_k0(k0):
    sel, (logits, ids, w, _, _) = call("oea", 4, oea_k0=k0)
    base = set(ids[:, :k0].flatten().tolist())
    assert torch.equal(sel.ids, backfill_ref(logits, ids, base, K))
    p = torch.softmax(logits, -1)
    manual = p.gather(1, sel.ids.clamp_min(0)) * (sel.ids >= 0)
    assert torch.allclose(sel.weights, manual / manual.sum(1, keepdim=True), atol=1e-6)


@pytest.mark.parametrize("M", [1, 3, 5])
def test_gate_sum_keeps_top_m_by_summed_router_weight(M):
    sel, (logits, ids, w, _, _) = call("gate_sum", M)
    score = torch.zeros(E).index_add_(0, ids.flatten(), w.flatten())
    expect = set(torch.sort(score, descending=True, stable=True).indices[:M].tolist())
    assert set(sel.ids[sel.ids >= 0].tolist()) == expect
    assert torch.equal(sel.ids, backfill_ref(logits, ids, expect, K))


@pytest.mark.parametrize("M", [1, 3])
def test_frequency_keeps_top_m_union_experts_by_calibrated_frequency(M):
    sel, (logits, ids, w, _, pred) = call("frequency", M)
    union = sorted(set(ids.flatten().tolist()))
    freq = pred.expert_freq[0]
    expect = set(sorted(union, key=lambda u: -float(freq[u]))[:M])
    assert set(sel.ids[sel.ids >= 0].tolist()) == expect


@pytest.mark.parametrize("s,rho", [(1, 0.0), (2, 0.0), (1, 0.6)])
def test_sere_reroutes_secondary_slots_to_most_similar_primary(s, rho):
    sel, (logits, ids, w, _, pred) = call("sere", 4, sere_s=s, sere_rho=rho)
    sim = pred.sere_sim[0]
    primary = set(ids[:, :s].flatten().tolist())
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j])
            if j < s or e in primary:
                want = e
            else:
                best = max(sorted(primary), key=lambda q: float(sim[e, q]))
                want = e if (rho > 0 and float(sim[e, best]) < rho) else best
            assert int(sel.ids[t, j]) == want
    assert torch.equal(sel.weights, w)  # SERE never renormalises


@pytest.mark.parametrize("D", [2, 4])
def test_exfold_folds_excluded_slots_into_min_loss_sink(D):
    sel, (logits, ids, w, _, pred) = call("exfold", D)
    h, loss, coef = pred.expert_norm[0], pred.exfold_loss[0], pred.exfold_coef[0]
    imp = torch.zeros(E)
    for t in range(T):
        for j in range(K):
            imp[ids[t, j]] += w[t, j] * h[ids[t, j]]
    union = set(ids.flatten().tolist())
    sub = [u for u in torch.sort(imp, descending=True, stable=True).indices.tolist() if u in union][:D]
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j])
            if e in sub:
                assert int(sel.ids[t, j]) == e and sel.weights[t, j] == w[t, j]
            else:
                sink = min(sorted(sub), key=lambda q: float(loss[e, q]))
                assert int(sel.ids[t, j]) == sink
                assert torch.isclose(sel.weights[t, j], w[t, j] * coef[e, sink])
    assert len(set(sel.ids.flatten().tolist())) <= D


@pytest.mark.parametrize("alpha,beta,tau", [(1.0, 5, 1.0), (2.0, 3, 1.0), (1.0, 5, 3.0)])
def test_lynx_keeps_experts_whose_binned_score_reaches_tau(alpha, beta, tau):
    sel, (logits, ids, w, _, _) = call("lynx", 4, lynx_alpha=alpha, lynx_beta=beta, lynx_tau=tau)
    score = torch.zeros(E)
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j])
            lr = float(logits[t, e] - logits[t].max())
            b = max(min(float(torch.floor(torch.tensor(alpha * lr))), 0.0), -beta)
            score[e] += T ** b
    kept = {u for u in range(E) if score[u] >= tau and u in set(ids.flatten().tolist())}
    assert torch.equal(sel.ids, backfill_ref(logits, ids, kept, K))
    if tau <= 1.0:  # every token's top-1 sits in bin 0 and is always kept
        assert set(ids[:, 0].tolist()) <= kept


def test_lynx_keeps_more_experts_with_a_lower_threshold():
    loose, _ = call("lynx", 4, lynx_tau=1.0)
    tight, _ = call("lynx", 4, lynx_tau=4.0)
    assert int(tight.stats.num_kept) <= int(loose.stats.num_kept)


@pytest.mark.parametrize("policy,kw", [("oea", {"oea_k0": 1}), ("sere", {"sere_s": 1})])
def test_slot_order_does_not_matter_for_oea_and_sere(policy, kw):
    """DeepSeek-V2's router returns its top-k unsorted: the top slots are taken by weight."""
    logits, ids, w, hidden, pred = setup()
    perm = torch.tensor([2, 0, 1])
    cfg = SelectionConfig(policy=policy, **kw)
    b = torch.full((T,), 4)
    ref = select_experts(logits, ids, w, hidden, b, 0, cfg, pred)
    shuf = select_experts(logits, ids[:, perm], w[:, perm], hidden, b, 0, cfg, pred)
    if policy == "sere":  # per-slot rule: the same slots, permuted
        assert torch.equal(shuf.ids, ref.ids[:, perm]) and torch.equal(shuf.weights, ref.weights[:, perm])
    else:  # the kept set is the same, so every token ends with the same set of experts
        assert [sorted(r) for r in shuf.ids.tolist()] == [sorted(r) for r in ref.ids.tolist()]
