"""base_plus and partial renormalisation: kept set = base's, weights = loop reference, edges, shapes."""

import math

import pytest
import torch
from core_helpers import make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.core.config import DEFAULT_POLICY, PARTIAL_NATIVE, POLICIES, RENORM_MODES

T, E, K, H = 12, 10, 3, 16


def routing(seed=0, norm_topk=True, skewed_w=False):
    logits, ids, w = make_routing(T, E, K, norm_topk=norm_topk, seed=seed)
    if skewed_w:  # weights not proportional to softmax p (a sigmoid-style or biased router)
        g = torch.Generator().manual_seed(seed + 7)
        w = w * (0.5 + torch.rand(T, K, generator=g))
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1))
    return logits, ids, w, hidden, make_predictor(E, H, K, seed=seed)


def select(r, budget, norm_topk=True, **kw):
    logits, ids, w, hidden, pred = r
    b = torch.full((T,), budget) if isinstance(budget, int) else budget
    return select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(**kw), pred,
                          norm_topk_prob=norm_topk, routed_norms=torch.rand(T, K) + 0.5)


def partial_ref(logits, ids, w, new_ids, alpha):
    """Loop reference (float64): per token, w_never * (W / sum w_never) ** alpha; unchanged rows keep w."""
    p = torch.softmax(logits.double(), -1)
    out = torch.zeros(new_ids.shape, dtype=torch.float64)
    for t in range(new_ids.shape[0]):
        own = [int(e) for e in ids[t]]
        new = [int(e) for e in new_ids[t]]
        if new == own:
            out[t] = w[t].double()
            continue
        W = float(w[t].double().sum())
        total_p = sum(float(p[t, e]) for e in own)
        never = []
        for e in new:
            if e < 0:
                never.append(0.0)
            elif e in own:
                never.append(float(w[t, own.index(e)]))
            else:
                never.append(float(p[t, e]) * W / total_p)
        scale = (W / sum(never)) ** alpha
        out[t] = torch.tensor([v * scale for v in never], dtype=torch.float64)
    return out


@pytest.mark.parametrize("M", [1, 2, 3, 4, 6, 9])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_base_plus_picks_exactly_the_ids_of_base(M, norm_topk):
    for seed in (0, 1):
        r = routing(seed, norm_topk)
        plus = select(r, M, norm_topk, policy="base_plus")
        base = select(r, M, norm_topk, policy="base")
        assert torch.equal(plus.ids, base.ids)
        assert torch.equal(plus.stats.num_kept, base.stats.num_kept)
        assert torch.equal(plus.stats.removed_cost, base.stats.removed_cost)


@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("norm_topk,skewed_w", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("M", [2, 4, 7])
def test_partial_weights_match_the_loop_reference(alpha, norm_topk, skewed_w, M):
    r = routing(3, norm_topk, skewed_w)
    sel = select(r, M, norm_topk, policy="base_plus", renorm_alpha=alpha)
    logits, ids, w, *_ = r
    ref = partial_ref(logits, ids, w, sel.ids, alpha)
    assert torch.allclose(sel.weights.double(), ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("norm_topk,skewed_w", [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("M", [1, 3, 5])
def test_alpha_zero_is_never_and_alpha_one_is_always(norm_topk, skewed_w, M):
    r = routing(1, norm_topk, skewed_w)
    never = select(r, M, norm_topk, policy="base", renorm="never")
    always = select(r, M, norm_topk, policy="base", renorm="always")
    a0 = select(r, M, norm_topk, policy="base_plus", renorm_alpha=0.0)
    a1 = select(r, M, norm_topk, policy="base_plus", renorm_alpha=1.0)
    assert torch.equal(a0.ids, never.ids) and torch.equal(a0.weights, never.weights)  # x ** 0 == 1
    W = r[2].sum(1)  # [T] the token's routed weight
    assert torch.allclose(a1.weights.sum(1), W, rtol=1e-6)  # alpha 1 restores each row's total
    if not skewed_w:  # weights proportional to p: "always" and alpha 1 are the same rescaling
        assert torch.allclose(a1.weights, always.weights, rtol=1e-5, atol=1e-7)
    else:  # otherwise they differ in how they split W, not in the total
        assert torch.allclose(always.weights.sum(1), W, rtol=1e-6)


@pytest.mark.parametrize("norm_topk", [True, False])
def test_unchanged_rows_keep_their_weights_bit_exactly(norm_topk):
    r = routing(2, norm_topk, skewed_w=True)
    logits, ids, w, *_ = r
    for m in range(E - 1, 1, -1):  # the largest budget that moves some rows and leaves others
        sel = select(r, m, norm_topk, policy="base_plus")
        same = (sel.ids == ids).all(1)  # [T]
        if same.any() and (~same).any():
            break
    assert same.any() and (~same).any()
    assert torch.equal(sel.weights[same], w[same])
    # and a changed row's weights really changed (partial is not a no-op)
    assert not torch.allclose(sel.weights[~same], w[~same])


def test_padded_rows_are_dropped_and_do_not_touch_real_rows():
    r = routing(0)
    logits, ids, w, hidden, pred = r
    budget = torch.full((T,), 3)
    budget[[1, 8]] = -1
    sel = select(r, budget, policy="base_plus")
    assert (sel.ids[[1, 8]] == -1).all() and (sel.weights[[1, 8]] == 0).all()
    real = budget >= 0
    sub = select_experts(logits[real], ids[real], w[real], hidden[real], budget[real], 0,
                         SelectionConfig(policy="base_plus"), pred)
    assert torch.equal(sel.ids[real], sub.ids) and torch.equal(sel.weights[real], sub.weights)
    all_pad = select(r, -1, policy="base_plus")
    assert (all_pad.ids == -1).all() and (all_pad.weights == 0).all()
    assert int(all_pad.stats.num_kept) == 0


@pytest.mark.parametrize("budget", [E, E + 3, 100])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_dense_budget_is_the_identity(budget, alpha, norm_topk):
    r = routing(4, norm_topk, skewed_w=True)
    sel = select(r, budget, norm_topk, policy="base_plus", renorm_alpha=alpha)
    assert torch.equal(sel.ids, r[1]) and torch.equal(sel.weights, r[2])


@pytest.mark.parametrize("alpha", [-0.1, 1.0001, 2.0, math.nan, math.inf, -math.inf])
def test_renorm_alpha_out_of_range_names_the_field(alpha):
    with pytest.raises(ValueError, match="renorm_alpha"):
        SelectionConfig(policy="base_plus", renorm_alpha=alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_renorm_alpha_bounds_are_accepted(alpha):
    assert SelectionConfig(policy="base_plus", renorm_alpha=alpha).renorm_alpha == alpha


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("renorm", RENORM_MODES)
@pytest.mark.parametrize("norm_topk", [True, False])
def test_combine_mode_for_every_policy_renorm_and_model(policy, renorm, norm_topk):
    mode = SelectionConfig(policy=policy, renorm=renorm).combine_mode(norm_topk)
    if renorm != "native":
        assert mode == renorm  # an explicit renorm always wins (ablation)
    elif policy in PARTIAL_NATIVE:  # base_plus, its issue-13 variants and base_fold
        assert mode == "partial"
    else:
        assert mode == ("always" if norm_topk else "never")  # the model's own convention


def test_default_policy_is_base_plus():
    assert DEFAULT_POLICY == "base_plus" and DEFAULT_POLICY in POLICIES
    assert SelectionConfig(policy=DEFAULT_POLICY).renorm_alpha == 0.5
