"""base_select_experts == core select_experts (policy base): ids exact, weights to fp32 rounding."""

import pytest
import torch
from kernel_helpers import DEVICE, compare_with_core, predictor, routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.core.selection import _batch_score, top_m_mask
from base_sglang.kernels import base_select, base_select_experts

H = 24
W_ATOL = 1e-6  # fp32 softmax/renorm in both; only rounding differs


@pytest.fixture(autouse=True, params=["fused", "two"])
def selection_kernel(request, monkeypatch):
    """Every test here runs through both selection kernels (base_select_experts' two paths)."""
    monkeypatch.setenv("BASE_SELECT_KERNEL", request.param)
    return request.param


def compare(T, E, K, budget, **kw):
    return compare_with_core(T, E, K, budget, policy="base", H=H, **kw)[0]


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("renorm,norm", [("native", True), ("native", False), ("always", False)])
def test_uniform_budget(id_dtype, renorm, norm):
    got = compare(6, 13, 4, [5] * 6, id_dtype=id_dtype, renorm=renorm, norm=norm)
    assert int(got.stats.num_kept) <= 5


def test_single_token():
    compare(1, 13, 4, [2], seed=3)


def test_budget_below_k_pads_with_minus_one():
    got = compare(5, 13, 4, [2] * 5, seed=4)
    assert ((got.ids >= 0).sum(1) == 2).all()


def test_padded_and_mixed_rows():
    got = compare(6, 13, 4, [-1, 3, 9, -1, 1, 4], seed=5)
    assert (got.ids[[0, 3]] == -1).all() and (got.weights[[0, 3]] == 0).all()


def test_dense_row_keeps_everything_bit_exact():
    logits, ids, w = routing(5, 13, 4, seed=6)
    got = compare(5, 13, 4, [1, 13, 2, 2, 2], seed=6)
    assert torch.equal(got.ids, ids) and torch.equal(got.weights, w)


def test_all_padded():
    got = compare(4, 13, 4, [-1] * 4, seed=7)
    assert (got.ids == -1).all() and int(got.stats.num_union) == 0


def test_all_tokens_on_one_expert():
    got = compare(6, 9, 3, [1] * 6, seed=8, one_expert=True)
    assert (got.ids[:, 0] == 0).all() and (got.ids[:, 1:] == -1).all()


@pytest.mark.parametrize("renorm", ["native", "never"])
def test_drop_only(renorm):
    compare(6, 13, 4, [4] * 6, seed=9, backfill=False, renorm=renorm)


def test_int32_budget_and_k_equals_e():
    compare(3, 4, 4, torch.tensor([2, 3, 2], dtype=torch.int32), seed=10)


def test_skipped_layer_and_other_policy_use_the_core():
    logits, ids, w = routing(4, 8, 2)
    pred = predictor(8, H)
    hidden = torch.randn(4, H, device=DEVICE)
    b = torch.full((4,), 3, device=DEVICE)
    for cfg in (SelectionConfig(policy="base", skip_layers=(0,)), SelectionConfig(policy="dense")):
        got = base_select_experts(logits, ids, w, hidden, b, 0, cfg, pred)
        want = select_experts(logits, ids, w, hidden, b, 0, cfg, pred)
        assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)
    with pytest.raises(ValueError, match="predictor"):
        base_select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base"), None)


def test_exact_ties_go_to_the_lower_expert_id():
    """Equal batch scores: the kernel's stable ranking equals the core's stable sort."""
    T, E, K = 4, 10, 2
    logits, ids, w = routing(T, E, K, seed=11)
    cost = torch.ones(T, K, device=DEVICE)  # D[e] = number of routing tokens: many exact ties
    budget = torch.full((T,), 3, device=DEVICE)
    new_ids, new_w, d, in_s, counts, removed = base_select(cost, ids, w, logits, budget)
    valid = torch.ones(T, K, dtype=torch.bool, device=DEVICE)
    d_ref = _batch_score(ids, cost, valid, E)
    in_union = d_ref > 0
    assert torch.equal(d, d_ref)
    assert torch.equal(in_s.bool(), top_m_mask(d_ref, torch.tensor(3, device=DEVICE), in_union))
    assert int(counts[0]) == int(in_union.sum()) and int(counts[1]) == 3


def test_padded_rows_may_hold_minus_one_ids():
    """SGLang marks DP padding rows with id -1; the kernel ignores them like any padded row.

    (The core gathers router probabilities at the ids and cannot take -1, so it gets the same rows
    with valid ids: a padded row's ids never influence the other rows.)
    """
    T, E, K = 5, 13, 4
    logits, ids, w = routing(T, E, K, seed=12)
    hidden = torch.randn(T, H, device=DEVICE)
    pred = predictor(E, H, seed=12)
    budget = torch.tensor([4, -1, 4, -1, 6], device=DEVICE)
    cfg = SelectionConfig(policy="base")
    want = select_experts(logits, ids, w, hidden, budget, 0, cfg, pred)
    ids_pad = ids.clone()
    ids_pad[budget < 0] = -1
    got = base_select_experts(logits, ids_pad, w, hidden, budget, 0, cfg, pred)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=W_ATOL)
