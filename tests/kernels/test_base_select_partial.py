"""base_select_experts == core select_experts for base_plus and the "partial" combine rule.

The kernel's combine modes ("always", "never", "partial" with alpha) against the core's
_combine_weights: ids exact, weights to fp32 rounding (one bf16 ulp for bf16 weights), rows whose
ids did not change keep the model's weights bit-exactly.
"""

import pytest
import torch
from kernel_helpers import DEVICE, compare_with_core, predictor, routing

from base_sglang.core import DEFAULT_POLICY, SelectionConfig, select_experts
from base_sglang.kernels import base_select, base_select_experts

H = 24


@pytest.fixture(autouse=True, params=["fused", "two"])
def selection_kernel(request, monkeypatch):
    """Every test here runs through both selection kernels (base_select_experts' two paths)."""
    monkeypatch.setenv("BASE_SELECT_KERNEL", request.param)
    return request.param


def compare(T, E, K, budget, *, policy="base_plus", **kw):
    return compare_with_core(T, E, K, budget, policy=policy, H=H, **kw)


def test_default_policy_is_base_plus():
    assert DEFAULT_POLICY == "base_plus"
    assert SelectionConfig(policy=DEFAULT_POLICY).combine_mode(True) == "partial"
    assert SelectionConfig(policy=DEFAULT_POLICY).combine_mode(False) == "partial"


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("policy,renorm,alpha,id_dtype", [
    ("base_plus", "native", 0.5, torch.int32), ("base_plus", "native", 0.5, torch.int64),
    ("base_plus", "native", 0.0, torch.int32), ("base_plus", "native", 1.0, torch.int64),
    ("base", "partial", 0.5, torch.int32), ("base_plus", "always", 0.5, torch.int64),
    ("base_plus", "never", 0.5, torch.int32)])
def test_mixed_budgets(policy, renorm, alpha, norm, id_dtype):
    # the id dtype only changes the kernel's loads and stores: both dtypes run the default combine,
    # each other combine runs with one of them
    got, _ = compare(6, 13, 4, [5, 2, 7, 5, 3, 4], policy=policy, renorm=renorm, alpha=alpha,
                     norm=norm, id_dtype=id_dtype)
    assert int(got.stats.num_kept) <= 7


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_padded_rows_and_budget_below_k(alpha):
    got, _ = compare(6, 13, 4, [-1, 2, 2, -1, 1, 2], alpha=alpha, seed=5)
    assert (got.ids[[0, 3]] == -1).all() and (got.weights[[0, 3]] == 0).all()
    assert ((got.ids >= 0).sum(1) <= 2).all()


def test_single_token_and_all_on_one_expert():
    compare(1, 13, 4, [2], seed=3)
    got, _ = compare(6, 9, 3, [1] * 6, seed=8, one_expert=True, norm=False)
    assert (got.ids[:, 0] == 0).all() and (got.ids[:, 1:] == -1).all()


def test_dense_budget_keeps_everything_bit_exact():
    got, (_, ids, w) = compare(5, 13, 4, [1, 13, 2, 2, 2], seed=6)
    assert torch.equal(got.ids, ids) and torch.equal(got.weights, w)


@pytest.mark.parametrize("norm", [True, False])
def test_bf16_weights(norm):
    compare(6, 13, 4, [4, 3, 5, 4, -1, 2], w_dtype=torch.bfloat16, norm=norm, seed=13)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_drop_only(alpha):
    compare(6, 13, 4, [4] * 6, seed=9, backfill=False, alpha=alpha, norm=False)


def test_k_equals_e_and_int32_budget():
    compare(3, 4, 4, torch.tensor([2, 3, 2], dtype=torch.int32), seed=10)


def test_partial_lies_between_never_and_always():
    """alpha 0 is "never" bit-exactly, alpha 1 is "always" for renormalised routing, 0.5 differs."""
    T, E, K = 6, 13, 4
    logits, ids, w = routing(T, E, K, seed=14, norm=True)
    cost = torch.rand(T, K, generator=torch.Generator().manual_seed(14)).to(DEVICE)
    bud = torch.full((T,), 3, device=DEVICE)
    out = {mode: base_select(cost, ids, w, logits, bud, combine=mode)[1]
           for mode in ("always", "never")}
    for alpha in (0.0, 0.5, 1.0):
        out[alpha] = base_select(cost, ids, w, logits, bud, combine="partial", alpha=alpha)[1]
    assert torch.equal(out[0.0], out["never"])
    torch.testing.assert_close(out[1.0], out["always"], rtol=0, atol=1e-6)
    changed = ~torch.isclose(out["never"], out["always"]).all(1)  # [T] rows whose rules differ
    assert changed.any()
    assert not torch.isclose(out[0.5][changed], out["never"][changed]).all()
    # the row total of partial is the geometric mean of never's and always' totals
    tot = {k: v.sum(1)[changed] for k, v in out.items()}
    torch.testing.assert_close(tot[0.5], (tot["never"] * tot["always"]).sqrt(), rtol=1e-5, atol=0)


def test_padded_rows_may_hold_minus_one_ids():
    T, E, K = 5, 13, 4
    logits, ids, w = routing(T, E, K, seed=12, norm=False)
    hidden = torch.randn(T, H, device=DEVICE)
    pred = predictor(E, H, seed=12)
    budget = torch.tensor([4, -1, 4, -1, 6], device=DEVICE)
    cfg = SelectionConfig(policy="base_plus")
    want = select_experts(logits, ids, w, hidden, budget, 0, cfg, pred, norm_topk_prob=False)
    ids_pad = ids.clone()
    ids_pad[budget < 0] = -1
    got = base_select_experts(logits, ids_pad, w, hidden, budget, 0, cfg, pred, norm_topk_prob=False)
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)


def test_bad_combine_arguments_name_the_field():
    logits, ids, w = routing(2, 8, 2)
    cost = torch.ones(2, 2, device=DEVICE)
    bud = torch.full((2,), 3, device=DEVICE)
    with pytest.raises(ValueError, match="combine"):
        base_select(cost, ids, w, logits, bud, combine="sometimes")
    with pytest.raises(ValueError, match="alpha"):
        base_select(cost, ids, w, logits, bud, combine="partial", alpha=1.5)


def test_error_bounds_run_the_core():
    """max_error (error-targeted budgets) is the core's feature: the launcher hands it over."""
    T, E, K = 4, 13, 4
    logits, ids, w = routing(T, E, K, seed=15)
    hidden = torch.randn(T, H, device=DEVICE)
    pred = predictor(E, H, seed=15)
    b = torch.full((T,), 8, device=DEVICE)
    bound = torch.tensor([0.5, float("nan"), 0.5, 0.5], device=DEVICE)
    cfg = SelectionConfig(policy="base_plus")
    want = select_experts(logits, ids, w, hidden, b, 0, cfg, pred, max_error=bound)
    got = base_select_experts(logits, ids, w, hidden, b, 0, cfg, pred, max_error=bound)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", [True, False])
def test_qwen3_shape_on_cuda(norm):
    """Qwen3-30B-A3B's routing shape (E=128, K=8, H=2048) on the GPU: base_plus kernel == core."""
    E, K, Hq = 128, 8, 2048
    g = torch.Generator().manual_seed(0)
    pred = predictor(E, Hq, seed=2)
    for T in (1, 16, 64):
        logits, ids, w = routing(T, E, K, seed=T, norm=norm)
        hidden = (torch.randn(T, Hq, generator=g) * 0.5).bfloat16().to(DEVICE)
        budget = torch.randint(K // 2, 24, (T,), generator=g).to(DEVICE)
        budget[::5] = -1
        for alpha in (0.0, 0.5, 1.0):
            cfg = SelectionConfig(policy="base_plus", renorm_alpha=alpha)
            args = (logits, ids, w, hidden, budget, 0, cfg, pred)
            want = select_experts(*args, norm_topk_prob=norm)
            got = base_select_experts(*args, norm_topk_prob=norm)
            assert torch.equal(got.ids, want.ids), (T, alpha)
            torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-5)
