"""Selection core: identity at the dense setting, brute-force optimality, backfill, renorm, edges."""

import itertools

import pytest
import torch
from core_helpers import backfill_ref, base_scores_ref, make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 12, 10, 3, 16


def run(policy="base", budget=None, T=T, E=E, K=K, pred=None, seed=0, norm_topk=True, **kw):
    logits, ids, w = make_routing(T, E, K, norm_topk=norm_topk, seed=seed)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1))
    pred = pred or make_predictor(E, H, K)
    b = torch.full((T,), E) if budget is None else budget
    if isinstance(b, int):
        b = torch.full((T,), b)
    sel = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy=policy, **kw), pred,
                         norm_topk_prob=norm_topk, routed_norms=torch.rand(T, K) + 0.5)
    return sel, (logits, ids, w, hidden, b, pred)


@pytest.mark.parametrize("policy,kw,budget", [
    ("dense", {}, 3),
    ("base", {}, E),
    ("base", {}, E + 5),
    ("base_plus", {}, E),
    ("base_plus", {"renorm_alpha": 1.0}, E),
    ("oracle", {"renorm": "partial"}, E),
    ("oracle", {}, E),
    ("gate_sum", {}, E),
    ("frequency", {}, E),
    ("exfold", {}, E),
    ("oea", {"oea_k0": K}, 4),
    ("sere", {"sere_s": K}, 4),
    ("lynx", {"lynx_alpha": 0.0}, 4),
])
def test_identity_at_dense_setting(policy, kw, budget):
    sel, (_, ids, w, *_rest) = run(policy, budget, **kw)
    assert torch.equal(sel.ids, ids)
    assert torch.equal(sel.weights, w)
    assert int(sel.stats.num_kept) == int(sel.stats.num_union)


def test_base_with_budget_at_union_size_is_identity():
    sel, (_, ids, w, *_r) = run("base", E)
    union = int(sel.stats.num_union)
    sel2, _ = run("base", union)
    assert torch.equal(sel2.ids, ids) and torch.equal(sel2.weights, w)


@pytest.mark.parametrize("M", [1, 2, 4, 6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_base_kept_set_minimises_additive_removal_objective(M, seed):
    sel, (logits, ids, w, hidden, b, pred) = run("base", M, seed=seed)
    D = base_scores_ref(pred, 0, hidden, ids, w, b >= 0)
    union = [u for u in range(E) if D[u] > 0]
    kept = set(sel.ids[sel.ids >= 0].tolist())
    assert len(kept) == min(M, len(union))
    best = min(sum(D[u] for u in union if u not in S)
               for S in itertools.combinations(union, min(M, len(union))))
    got = sum(D[u] for u in union if u not in kept)
    assert float(got) == pytest.approx(float(best), rel=1e-5)
    assert float(sel.stats.removed_cost) == pytest.approx(float(got), rel=1e-4)


@pytest.mark.parametrize("M", [1, 2, 3, 5, 7])
def test_backfill_follows_each_tokens_preference_order(M):
    sel, (logits, ids, *_r) = run("base", M)
    kept = set(sel.ids[sel.ids >= 0].tolist())
    assert torch.equal(sel.ids, backfill_ref(logits, ids, kept, K))


def test_drop_only_keeps_slot_positions():
    sel, (logits, ids, *_r) = run("base", 4, backfill=False)
    kept = set(sel.ids[sel.ids >= 0].tolist())
    expect = torch.where(torch.tensor([[int(x) in kept for x in r] for r in ids]), ids, -1)
    assert torch.equal(sel.ids, expect)


def test_renorm_options():
    # norm_topk model: native == always, weights of every row sum to 1
    sel, (logits, ids, w, *_r) = run("base", 4, renorm="native")
    sel_a, _ = run("base", 4, renorm="always")
    assert torch.equal(sel.weights, sel_a.weights)
    assert torch.allclose(sel.weights.sum(1), torch.ones(T), atol=1e-6)
    p = torch.softmax(logits, -1)
    manual = p.gather(1, sel.ids.clamp_min(0)) * (sel.ids >= 0)
    assert torch.allclose(sel.weights, manual / manual.sum(1, keepdim=True), atol=1e-6)
    # never: routed experts keep their own weight, backfilled get p scaled like the routed ones
    sel_n, _ = run("base", 4, renorm="never")
    for t in range(T):
        for k in range(K):
            e = int(sel_n.ids[t, k])
            if e < 0:
                assert sel_n.weights[t, k] == 0
            elif e in ids[t].tolist():
                assert sel_n.weights[t, k] == w[t, ids[t].tolist().index(e)]
            else:
                scale = w[t].sum() / p[t, ids[t]].sum()
                assert torch.isclose(sel_n.weights[t, k], p[t, e] * scale, atol=1e-6)
    # a model without renormalisation: native == never, backfilled weight is the raw probability
    sel_raw, (lg, ids_raw, w_raw, *_r) = run("base", 4, norm_topk=False, renorm="native")
    sel_raw_n, _ = run("base", 4, norm_topk=False, renorm="never")
    assert torch.equal(sel_raw.weights, sel_raw_n.weights)
    p_raw = torch.softmax(lg, -1)
    assert torch.allclose(sel_raw.weights, p_raw.gather(1, sel_raw.ids.clamp_min(0)) * (sel_raw.ids >= 0),
                          atol=1e-6)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_partial_renorm_is_the_geometric_mean_of_never_and_always(norm_topk):
    sel_n, (logits, ids, w, *_r) = run("base", 4, norm_topk=norm_topk, renorm="never")
    sel_a, _ = run("base", 4, norm_topk=norm_topk, renorm="always")
    for alpha in (0.0, 0.5, 1.0):
        sel_p, _ = run("base", 4, norm_topk=norm_topk, renorm="partial", renorm_alpha=alpha)
        assert torch.equal(sel_p.ids, sel_n.ids)
        # per token: never-weights times (W / their sum) ** alpha, W = the token's routed weight
        scale = (w.sum(1) / sel_n.weights.sum(1)).pow(alpha)  # [T]
        assert torch.allclose(sel_p.weights, sel_n.weights * scale[:, None], atol=1e-6)
    sel_h, _ = run("base", 4, norm_topk=norm_topk, renorm="partial", renorm_alpha=0.5)
    assert torch.allclose(sel_h.weights.square(), sel_n.weights * sel_a.weights, atol=1e-6)
    changed = ~(sel_n.ids == ids).all(1)
    assert changed.any()  # the budget moves some tokens, and for them the total weight lies between
    tot_n, tot_h, tot_a = (s.weights.sum(1)[changed] for s in (sel_n, sel_h, sel_a))
    assert (tot_n <= tot_h + 1e-6).all() and (tot_h <= tot_a + 1e-6).all()


def test_base_plus_is_base_with_partial_renorm():
    for M in (1, 3, 4, 7):
        plus, _ = run("base_plus", M)
        ref, _ = run("base", M, renorm="partial", renorm_alpha=0.5)
        assert torch.equal(plus.ids, ref.ids) and torch.equal(plus.weights, ref.weights)
        assert torch.equal(plus.stats.removed_cost, ref.stats.removed_cost)
        never, _ = run("base_plus", M, renorm="never")  # an explicit renorm still wins (ablation)
        assert torch.equal(never.weights, run("base", M, renorm="never")[0].weights)
    assert SelectionConfig(policy="base_plus").combine_mode(False) == "partial"
    assert SelectionConfig(policy="base").combine_mode(False) == "never"
    with pytest.raises(ValueError, match="renorm_alpha"):
        SelectionConfig(renorm="partial", renorm_alpha=1.5)


def test_padded_rows_are_dropped_and_contribute_nothing():
    budget = torch.full((T,), 4)
    budget[[2, 7]] = -1
    sel, (logits, ids, w, hidden, b, pred) = run("base", budget)
    assert (sel.ids[[2, 7]] == -1).all() and (sel.weights[[2, 7]] == 0).all()
    real = torch.tensor([t not in (2, 7) for t in range(T)])
    sub = select_experts(logits[real], ids[real], w[real], hidden[real], budget[real], 0,
                         SelectionConfig(), pred)
    assert torch.equal(sel.ids[real], sub.ids)
    assert torch.equal(sel.weights[real], sub.weights)
    all_pad = select_experts(logits, ids, w, hidden, torch.full((T,), -1), 0, SelectionConfig(), pred)
    assert (all_pad.ids == -1).all() and int(all_pad.stats.num_kept) == 0


def test_dense_row_makes_the_batch_dense():
    budget = torch.full((T,), 2)
    budget[5] = E
    sel, (_, ids, w, *_r) = run("base", budget)
    assert torch.equal(sel.ids, ids) and torch.equal(sel.weights, w)


def test_mixed_budgets_use_the_largest_budget_for_everyone():
    budget = torch.tensor([1, 2, 5] * (T // 3))
    sel, _ = run("base", budget)
    sel5, _ = run("base", 5)
    assert torch.equal(sel.ids, sel5.ids) and torch.equal(sel.weights, sel5.weights)
    assert len(set(sel.ids[sel.ids >= 0].tolist())) <= 5


@pytest.mark.parametrize("policy", ["base_plus", "base", "oracle", "gate_sum", "frequency", "exfold"])
@pytest.mark.parametrize("M", [1, 2, 5])
def test_budgeted_policies_never_exceed_the_budget(policy, M):
    sel, _ = run(policy, M)
    executed = set(sel.ids[sel.ids >= 0].tolist())
    assert len(executed) <= M
    assert int(sel.stats.num_kept) == len(executed)


def test_budget_below_k_leaves_empty_slots():
    sel, _ = run("base", 2)
    assert ((sel.ids >= 0).sum(1) == 2).all()  # every token backfills up to |S| = 2 < K
    assert (sel.weights[sel.ids < 0] == 0).all()


def test_budget_one_sends_every_token_to_one_expert():
    sel, _ = run("base", 1)
    col = sel.ids[:, 0]
    assert (col == col[0]).all() and (sel.ids[:, 1:] == -1).all()
    assert torch.allclose(sel.weights[:, 0], torch.ones(T))


def test_all_tokens_on_one_expert():
    logits = torch.zeros(T, E)
    logits[:, 3] = 5.0
    logits[:, 4] = 4.0
    logits[:, 5] = 3.0
    p = torch.softmax(logits, -1)
    w, ids = torch.topk(p, K)
    w = w / w.sum(-1, keepdim=True)
    pred = make_predictor(E, H, K)
    hidden = torch.randn(T, H)
    sel = select_experts(logits, ids, w, hidden, torch.full((T,), 1), 0, SelectionConfig(), pred)
    assert int(sel.stats.num_union) == 3
    D = base_scores_ref(pred, 0, hidden, ids, w, torch.ones(T, dtype=torch.bool))
    assert set(sel.ids[sel.ids >= 0].tolist()) == {int(D.argmax())}
    assert (sel.ids[:, 1:] == -1).all()


def test_single_token():
    sel, (logits, ids, *_r) = run("base", 2, T=1)
    assert sel.ids.shape == (1, K)
    assert torch.equal(sel.ids[0, :2], ids[0, :2]) or (sel.ids[0] >= 0).sum() == 2


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_id_dtype_is_preserved(dtype):
    logits, ids, w = make_routing(T, E, K, dtype=dtype)
    sel = select_experts(logits, ids, w, torch.randn(T, H), torch.full((T,), 4), 0, SelectionConfig(),
                         make_predictor(E, H, K))
    assert sel.ids.dtype == dtype and sel.weights.dtype == w.dtype
    ref = select_experts(logits, ids.long(), w, torch.randn(T, H, generator=torch.Generator()
                         .manual_seed(9)), torch.full((T,), 4), 0, SelectionConfig(), make_predictor(E, H, K))
    assert ref.ids.dtype == torch.int64


def test_bf16_weights_round_trip():
    logits, ids, w = make_routing(T, E, K)
    sel = select_experts(logits.bfloat16(), ids, w.bfloat16(), torch.randn(T, H).bfloat16(),
                         torch.full((T,), 4), 0, SelectionConfig(), make_predictor(E, H, K))
    assert sel.weights.dtype == torch.bfloat16
    assert len(set(sel.ids[sel.ids >= 0].tolist())) <= 4


@pytest.mark.parametrize("policy", ["base", "base_plus"])
def test_deterministic(policy):
    a, _ = run(policy, 3)
    for _ in range(3):
        b, _ = run(policy, 3)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.weights, b.weights)
        assert torch.equal(a.stats.removed_cost, b.stats.removed_cost)


def test_skip_layers_stay_dense():
    sel, (_, ids, w, *_r) = run("base", 2, skip_layers=(0,))
    assert torch.equal(sel.ids, ids) and torch.equal(sel.weights, w)


def test_missing_statistics_are_clear_errors():
    logits, ids, w = make_routing(T, E, K)
    with pytest.raises(ValueError, match="predictor"):
        select_experts(logits, ids, w, torch.randn(T, H), torch.full((T,), 2), 0,
                       SelectionConfig(policy="base"), None)
    with pytest.raises(ValueError, match="sere_sim"):
        select_experts(logits, ids, w, None, torch.full((T,), 2), 0, SelectionConfig(policy="sere"),
                       make_predictor(E, H, K, with_stats=False))
    with pytest.raises(ValueError, match="routed_norms"):
        select_experts(logits, ids, w, None, torch.full((T,), 2), 0, SelectionConfig(policy="oracle"))
    with pytest.raises(ValueError, match="policy"):
        SelectionConfig(policy="nope")
    with pytest.raises(ValueError, match="renorm"):
        SelectionConfig(renorm="sometimes")


@pytest.mark.parametrize("policy,kw", [("base", {}), ("base", {"backfill": False}), ("dense", {}),
                                       ("gate_sum", {}), ("oea", {}), ("lynx", {}), ("sere", {}),
                                       ("exfold", {}), ("base", {"renorm": "never"})])
def test_minus_one_ids_in_padded_rows_are_accepted(policy, kw):
    """SGLang marks DP padding rows with -1 ids; they must not crash or leak into real rows."""
    logits, ids, w = make_routing(T, E, K)
    hidden = torch.randn(T, H)
    pred = make_predictor(E, H, K)
    budget = torch.full((T,), 4)
    ref = select_experts(logits, ids, w, hidden, budget, 0, SelectionConfig(policy=policy, **kw), pred)
    budget[[0, 5]] = -1
    ids_pad, w_pad = ids.clone(), w.clone()
    ids_pad[[0, 5]] = -1
    w_pad[[0, 5]] = 0
    sel = select_experts(logits, ids_pad, w_pad, hidden, budget, 0, SelectionConfig(policy=policy, **kw),
                         pred)
    assert (sel.ids[[0, 5]] == -1).all() and (sel.weights[[0, 5]] == 0).all()
    real = budget >= 0
    sub = select_experts(logits[real], ids[real], w[real], hidden[real], budget[real], 0,
                         SelectionConfig(policy=policy, **kw), pred)
    assert torch.equal(sel.ids[real], sub.ids) and torch.equal(sel.weights[real], sub.weights)
    assert ref.ids.shape == sel.ids.shape
