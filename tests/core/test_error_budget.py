"""Error-targeted budgets: the batch budget is the smallest M meeting every bounded row (brute force)."""

import pytest
import torch
from core_helpers import base_scores_ref, make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.core.error_budget import error_budgets, score_rank

T, E, K, H = 10, 12, 3, 16


def setup(seed=0):
    logits, ids, w = make_routing(T, E, K, seed=seed)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1))
    return logits, ids, w, hidden, make_predictor(E, H, K, seed=seed)


def brute_force_m(pred, hidden, ids, w, eps, budget):
    """Smallest batch M (1..E) such that every bounded row's predicted error at top-M is <= eps."""
    D = base_scores_ref(pred, 0, hidden, ids, w, budget >= 0).float()
    union = D > 0
    order = [int(u) for u in torch.sort(torch.where(union, D, torch.full_like(D, -1.0)),
                                         descending=True, stable=True).indices]
    yhat = pred.predict_log_norm(0, hidden, ids)
    c = w.float().square() * torch.exp(2 * yhat)  # [T, K]
    asks = []
    for t in range(T):
        if budget[t] < 0:
            continue
        if torch.isnan(eps[t]):
            asks.append(int(budget[t]))
            continue
        for m in range(1, E + 1):
            kept = set(order[:m])
            err = sum(float(c[t, k]) for k in range(K) if int(ids[t, k]) not in kept)
            if err <= float(eps[t]) * float(c[t].double().sum()) * (1 + 1e-6):
                break
        asks.append(min(m, int(budget[t])))
    return max(asks)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("eps", [0.0, 0.01, 0.05, 0.2, 0.5, 0.99, 1.0])
def test_batch_budget_is_the_brute_force_smallest(seed, eps):
    logits, ids, w, hidden, pred = setup(seed)
    budget = torch.full((T,), E)
    max_error = torch.full((T,), eps)
    max_error[3] = float("nan")  # a row without a bound keeps its integer budget ...
    budget[3] = 2
    budget[5] = 4  # ... and a bounded row's integer budget is its cap
    budget[7] = -1  # a padded row asks for nothing
    m = brute_force_m(pred, hidden, ids, w, max_error, budget)
    sel = select_experts(logits, ids, w, hidden, budget, 0, SelectionConfig(policy="base_plus"),
                         pred, max_error=max_error)
    fixed = select_experts(logits, ids, w, hidden, torch.where(budget >= 0, m, -1), 0,
                           SelectionConfig(policy="base_plus"), pred)
    assert torch.equal(sel.ids, fixed.ids) and torch.equal(sel.weights, fixed.weights)
    assert int(sel.stats.num_kept) == min(m, int(sel.stats.num_union))


def test_no_bound_changes_nothing_and_zero_bound_keeps_every_routed_expert():
    logits, ids, w, hidden, pred = setup()
    b = torch.full((T,), 4)
    cfg = SelectionConfig(policy="base_plus")
    plain = select_experts(logits, ids, w, hidden, b, 0, cfg, pred)
    nan = select_experts(logits, ids, w, hidden, b, 0, cfg, pred,
                         max_error=torch.full((T,), float("nan")))
    assert torch.equal(plain.ids, nan.ids) and torch.equal(plain.weights, nan.weights)
    zero = select_experts(logits, ids, w, hidden, torch.full((T,), E), 0, cfg, pred,
                          max_error=torch.zeros(T))
    assert torch.equal(zero.ids, ids) and torch.equal(zero.weights, w)  # eps 0: nothing may go


def test_error_budgets_direct_and_rank():
    score = torch.tensor([3.0, 0.0, 5.0, 1.0])
    union = torch.tensor([True, False, True, True])
    assert score_rank(score, union).tolist() == [1, 3, 0, 2]  # 2, 0, 3 kept first; 1 not in union
    rank = score_rank(score, union)
    ids = torch.tensor([[0, 3], [2, 0]])
    cost = torch.tensor([[1.0, 1.0], [3.0, 1.0]])
    valid = torch.ones(2, 2, dtype=torch.bool)
    b = torch.tensor([4, 4])
    # row 0: experts ranked 1 and 2; losing expert 3 (rank 2) is half its cost -> M = 2 at eps 0.5
    out = error_budgets(cost, ids, valid, rank, torch.tensor([0.5, 0.25]), b)
    assert out.tolist() == [2, 1]  # row 1 keeps expert 2 (rank 0); losing 0 costs 1/4
    assert error_budgets(cost, ids, valid, rank, torch.tensor([0.4, 0.2]), b).tolist() == [3, 2]


def test_oracle_uses_true_norms_and_other_policies_refuse():
    logits, ids, w, hidden, pred = setup()
    norms = torch.rand(T, K) + 0.5
    sel = select_experts(logits, ids, w, hidden, torch.full((T,), E), 0, SelectionConfig(policy="oracle"),
                         pred, routed_norms=norms, max_error=torch.full((T,), 0.1))
    assert int(sel.stats.num_kept) <= int(sel.stats.num_union)
    for policy in ("gate_sum", "oea"):
        with pytest.raises(ValueError, match="max_error"):
            select_experts(logits, ids, w, hidden, torch.full((T,), E), 0,
                           SelectionConfig(policy=policy), pred, max_error=torch.full((T,), 0.1))
    with pytest.raises(ValueError, match="max_error"):
        select_experts(logits, ids, w, None, torch.full((T,), E), 0, SelectionConfig(policy="base_plus"),
                       pred, max_error=torch.full((T,), 0.1))


def test_error_budget_runs_on_meta_tensors_and_is_deterministic():
    meta = torch.device("meta")
    pred = make_predictor(E, H, K).to(meta)
    sel = select_experts(torch.empty(T, E, device=meta), torch.empty(T, K, dtype=torch.int32, device=meta),
                         torch.empty(T, K, device=meta), torch.empty(T, H, device=meta),
                         torch.empty(T, dtype=torch.int64, device=meta), 0,
                         SelectionConfig(policy="base_plus"), pred,
                         max_error=torch.empty(T, device=meta))
    assert sel.ids.shape == (T, K)
    logits, ids, w, hidden, pred = setup()
    runs = [select_experts(logits, ids, w, hidden, torch.full((T,), E), 0,
                           SelectionConfig(policy="base_plus"), pred, max_error=torch.full((T,), 0.05))
            for _ in range(3)]
    assert all(torch.equal(r.ids, runs[0].ids) and torch.equal(r.weights, runs[0].weights) for r in runs)


@pytest.mark.parametrize("seed", [0, 3])
def test_rows_with_different_bounds_take_the_tightest_request(seed):
    logits, ids, w, hidden, pred = setup(seed)
    budget = torch.full((T,), E)
    max_error = torch.linspace(0.02, 0.9, T)  # every row its own bound
    m = brute_force_m(pred, hidden, ids, w, max_error, budget)
    sel = select_experts(logits, ids, w, hidden, budget, 0, SelectionConfig(policy="base_plus"), pred,
                         max_error=max_error)
    fixed = select_experts(logits, ids, w, hidden, torch.full((T,), m), 0,
                           SelectionConfig(policy="base_plus"), pred)
    assert torch.equal(sel.ids, fixed.ids) and torch.equal(sel.weights, fixed.weights)
    # the loosest rows alone would ask for less
    loose = brute_force_m(pred, hidden, ids, w, torch.full((T,), 0.9), budget)
    assert loose <= m


def test_minus_one_ids_of_padded_rows_do_not_move_the_bounded_budget():
    logits, ids, w, hidden, pred = setup(1)
    budget = torch.full((T,), E)
    budget[[0, 4]] = -1
    ids_pad, w_pad = ids.clone(), w.clone()
    ids_pad[[0, 4]] = -1
    w_pad[[0, 4]] = 0
    cfg = SelectionConfig(policy="base_plus")
    eps = torch.full((T,), 0.1)
    sel = select_experts(logits, ids_pad, w_pad, hidden, budget, 0, cfg, pred, max_error=eps)
    assert (sel.ids[[0, 4]] == -1).all() and (sel.weights[[0, 4]] == 0).all()
    real = budget >= 0
    sub = select_experts(logits[real], ids[real], w[real], hidden[real], budget[real], 0, cfg, pred,
                         max_error=eps[real])
    assert torch.equal(sel.ids[real], sub.ids) and torch.equal(sel.weights[real], sub.weights)
