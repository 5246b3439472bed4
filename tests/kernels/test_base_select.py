"""base_select_experts (one launch) == core select_experts (policy base): ids exact, weights to fp32
rounding, stats; every output written (outputs poisoned); D and the kept set == the core's."""

import pytest
import torch
from kernel_helpers import DEVICE, poisoned_outputs, predictor, routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.core.selection import _batch_score, top_m_mask
from base_sglang.kernels import base_select, base_select_experts

H = 24
W_ATOL = 1e-6  # fp32 softmax/renorm in both; only rounding differs


def compare(T, E, K, budget, *, seed=0, one_expert=False, id_dtype=torch.int64, renorm="native",
            backfill=True, norm=True, drop=(), hidden_dtype=torch.bfloat16, w_dtype=torch.float32,
            logit_dtype=torch.float32, a_dtype=torch.float32, h=H):
    logits, ids, w = routing(T, E, K, seed=seed, one_expert=one_expert, norm=norm, id_dtype=id_dtype)
    for t, k in drop:
        ids[t, k] = -1
    logits, w = logits.to(logit_dtype), w.to(w_dtype)
    hidden = torch.randn(T, h, generator=torch.Generator().manual_seed(seed + 1)).to(hidden_dtype)
    pred = predictor(E, h, seed=seed)
    pred_k = predictor(E, h, seed=seed)  # the kernel's copy: bf16 rows where asked
    pred_k.weight = pred_k.weight.to(a_dtype)
    pred.weight = pred_k.weight.float()  # the core (fp32 only) gets the same values
    cfg = SelectionConfig(policy="base", renorm=renorm, backfill=backfill)
    b = torch.as_tensor(budget).to(DEVICE)
    args = (logits, ids, w, hidden.to(DEVICE), b, 0, cfg)
    want = select_experts(*args, pred, norm_topk_prob=norm)
    with poisoned_outputs():
        got = base_select_experts(*args, pred_k, norm_topk_prob=norm)
    assert got.ids.dtype == ids.dtype and got.weights.dtype == w.dtype
    assert torch.equal(got.ids, want.ids), (got.ids, want.ids)
    atol = W_ATOL if w_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=atol)
    assert int(got.stats.num_union) == int(want.stats.num_union)
    assert int(got.stats.num_kept) == int(want.stats.num_kept)
    torch.testing.assert_close(got.stats.removed_cost, want.stats.removed_cost, rtol=1e-5, atol=1e-6)
    return got


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("renorm,norm", [("native", True), ("native", False), ("always", False)])
def test_uniform_budget(id_dtype, renorm, norm):
    got = compare(6, 13, 4, [5] * 6, id_dtype=id_dtype, renorm=renorm, norm=norm)
    assert int(got.stats.num_kept) <= 5


@pytest.mark.parametrize("T,E,K,budget", [
    (1, 13, 4, [2]),  # one token
    (1, 8, 2, [1]),  # budget 1
    (5, 13, 4, [13] * 5),  # budget = E: dense
    (3, 4, 4, [2, 3, 2]),  # K = E
    (9, 6, 6, [3] * 9),  # K = E, not a power of 2
    (7, 33, 5, [7] * 7),  # E just past a power of 2
    (70, 13, 3, [4] * 70),  # more tokens than one row chunk (two chunks)
    (40, 128, 8, [16] * 40),  # Qwen3-like E, K
])
def test_shapes(T, E, K, budget):
    compare(T, E, K, budget, seed=T + E)


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


@pytest.mark.parametrize("T", [6, 20])  # 20 tokens on one expert: several dot groups
def test_all_tokens_on_one_expert(T):
    got = compare(T, 9, 3, [1] * T, seed=8, one_expert=True)
    assert (got.ids[:, 0] == 0).all() and (got.ids[:, 1:] == -1).all()


@pytest.mark.parametrize("renorm", ["native", "never"])
def test_drop_only(renorm):
    compare(6, 13, 4, [4] * 6, seed=9, backfill=False, renorm=renorm)


@pytest.mark.parametrize("renorm,backfill", [("native", True), ("never", True), ("never", False)])
def test_dropped_slots_in_real_rows(renorm, backfill):
    """-1 slots of real rows score nothing and (with backfill) are refilled from the kept set."""
    compare(6, 13, 4, [5, 5, 13, 5, 2, 5], seed=13, drop=[(0, 1), (2, 3), (4, 0), (4, 1)],
            renorm=renorm, backfill=backfill)


def test_int32_budget():
    compare(3, 9, 3, torch.tensor([2, 3, 2], dtype=torch.int32), seed=10)


@pytest.mark.parametrize("dtypes", [
    dict(hidden_dtype=torch.float32, a_dtype=torch.bfloat16),
    dict(w_dtype=torch.bfloat16, logit_dtype=torch.bfloat16),
])
def test_input_dtypes(dtypes):
    compare(7, 13, 4, [5] * 7, seed=14, **dtypes)


def test_wide_hidden():
    compare(5, 13, 4, [5] * 5, seed=15, h=1100)  # H not a power of 2, several hundred wide


def test_repeated_calls_reset_the_ticket():
    """The last program resets the counter: back-to-back calls give the same answer."""
    for _ in range(3):
        compare(6, 13, 4, [5] * 6, seed=16)


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


def _raw(T, E, K, budget, seed, hidden=None):
    logits, ids, w = routing(T, E, K, seed=seed)
    pred = predictor(E, H, seed=seed)
    if hidden is None:
        hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    b = torch.as_tensor(budget).to(DEVICE)
    with poisoned_outputs():
        out = base_select(hidden, ids, w, logits, b, pred.weight[0], pred.bias[0])
    return out, (logits, ids, w, hidden, b, pred)


def test_batch_score_and_kept_set_match_the_core():
    T, E, K = 9, 13, 3
    (new_ids, new_w, d, in_s, counts, removed), (logits, ids, w, hidden, b, pred) = _raw(
        T, E, K, [4] * T, seed=17)
    yhat = pred.predict_log_norm(0, hidden, ids)
    valid = torch.ones(T, K, dtype=torch.bool, device=DEVICE)
    d_ref = _batch_score(ids, w.square() * torch.exp(2.0 * yhat), valid, E)
    in_union = d_ref > 0
    torch.testing.assert_close(d, d_ref, rtol=1e-5, atol=0)
    assert torch.equal(in_s.bool(), top_m_mask(d_ref, torch.tensor(4, device=DEVICE), in_union))
    assert counts.tolist() == [int(in_union.sum()), 4]
    torch.testing.assert_close(removed[0], (d_ref * (in_union & ~in_s.bool())).sum())


def test_exact_ties_go_to_the_lower_expert_id():
    """Equal batch scores: zero hidden and predictor give D[e] = sum of w^2 over e's tokens; with
    equal weights every routed expert of a token ties, and the stable order decides."""
    T, E, K = 4, 10, 2
    logits, ids, w = routing(T, E, K, seed=11)
    w = torch.full_like(w, 0.5)
    pred = predictor(E, H)
    pred.weight.zero_()
    pred.bias.zero_()
    hidden = torch.zeros(T, H, device=DEVICE)
    b = torch.full((T,), 3, device=DEVICE)
    new_ids, new_w, d, in_s, counts, removed = base_select(hidden, ids, w, logits, b,
                                                           pred.weight[0], pred.bias[0])
    valid = torch.ones(T, K, dtype=torch.bool, device=DEVICE)
    d_ref = _batch_score(ids, w.square(), valid, E)  # exact: sums of 0.25
    in_union = d_ref > 0
    assert torch.equal(d, d_ref)
    assert torch.equal(in_s.bool(), top_m_mask(d_ref, torch.tensor(3, device=DEVICE), in_union))
    assert int(counts[0]) == int(in_union.sum()) and int(counts[1]) == 3
    cfg = SelectionConfig(policy="base")
    want = select_experts(logits, ids, w, hidden, b, 0, cfg, pred)
    assert torch.equal(new_ids, want.ids)


def test_padded_rows_may_hold_minus_one_ids():
    """SGLang marks DP padding rows with id -1; the kernel ignores them like any padded row."""
    T, E, K = 5, 13, 4
    logits, ids, w = routing(T, E, K, seed=12)
    hidden = torch.randn(T, H, device=DEVICE)
    pred = predictor(E, H, seed=12)
    budget = torch.tensor([4, -1, 4, -1, 6], device=DEVICE)
    cfg = SelectionConfig(policy="base")
    want = select_experts(logits, ids, w, hidden, budget, 0, cfg, pred)
    ids_pad = ids.clone()
    ids_pad[budget < 0] = -1
    with poisoned_outputs():
        got = base_select_experts(logits, ids_pad, w, hidden, budget, 0, cfg, pred)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=W_ATOL)


def test_strided_hidden_rows():
    wide = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    (ids1, w1, d1, *_), _ = _raw(6, 13, 4, [5] * 6, seed=18, hidden=wide[:, :H])
    (ids2, w2, d2, *_), _ = _raw(6, 13, 4, [5] * 6, seed=18, hidden=wide[:, :H].contiguous())
    assert torch.equal(ids1, ids2) and torch.equal(w1, w2) and torch.equal(d1, d2)


@pytest.mark.parametrize("bad,match", [("ids_float", "ids: dtype"), ("budget_shape", "budget: shape"),
                                       ("a_width", "a: expected"), ("hidden_rows", "hidden")])
def test_contract_errors(bad, match):
    logits, ids, w = routing(4, 8, 2)
    pred = predictor(8, 16)
    hidden = torch.randn(4, 16, device=DEVICE)
    budget = torch.full((4,), 3, device=DEVICE)
    a = pred.weight[0]
    if bad == "ids_float":
        ids = ids.float()
    elif bad == "budget_shape":
        budget = budget[:3]
    elif bad == "a_width":
        a = a[:, :8]
    else:
        hidden = hidden[:3]
    with pytest.raises(ValueError, match=match):
        base_select(hidden, ids, w, logits, budget, a, pred.bias[0])
