"""base_score == the core's predicted removal cost w^2 exp(2 yhat), on routed pairs of real rows."""

import pytest
import torch
from kernel_helpers import DEVICE, predictor, routing

from base_sglang.kernels import base_score

# fp32 accumulation in both; only the summation order over H differs
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-7), torch.bfloat16: dict(rtol=1e-5, atol=1e-7)}


def reference(hidden, ids, w, budget, pred):
    yhat = pred.predict_log_norm(0, hidden, ids)  # [T, K]
    cost = w.float().square() * torch.exp(2.0 * yhat)
    return torch.where((budget >= 0)[:, None] & (ids >= 0), cost, torch.zeros_like(cost))


@pytest.mark.parametrize("T,E,K,H", [(1, 13, 4, 40), (6, 8, 2, 33), (5, 13, 3, 1100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_matches_core(T, E, K, H, dtype, id_dtype):
    logits, ids, w = routing(T, E, K, seed=T + E, id_dtype=id_dtype)
    pred = predictor(E, H)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEVICE)
    budget = torch.full((T,), 3, device=DEVICE)
    budget[1::2] = -1  # padded rows score nothing
    got = base_score(hidden, ids, w, budget, pred.weight[0], pred.bias[0])
    want = reference(hidden, ids.long(), w, budget, pred)
    torch.testing.assert_close(got, want, **TOL[dtype])
    assert (got[budget < 0] == 0).all()
    assert (got[budget >= 0] > 0).all()


def test_dropped_slot_scores_zero():
    logits, ids, w = routing(3, 9, 3)
    ids[0, 1] = -1
    pred = predictor(9, 16)
    hidden = torch.randn(3, 16, device=DEVICE)
    got = base_score(hidden, ids, w, torch.full((3,), 5, device=DEVICE), pred.weight[0], pred.bias[0])
    assert got[0, 1] == 0 and (got[1:] > 0).all()


def test_strided_hidden_rows():
    logits, ids, w = routing(4, 8, 2)
    pred = predictor(8, 16)
    wide = torch.randn(4, 40, device=DEVICE)
    no_budget = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    got = base_score(wide[:, :16], ids, w, no_budget, pred.weight[0], pred.bias[0])
    want = reference(wide[:, :16].contiguous(), ids, w, no_budget, pred)
    torch.testing.assert_close(got, want.to(got.device), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bad,match", [("ids_float", "ids: dtype"), ("budget_shape", "budget: shape"),
                                       ("a_width", "a: expected")])
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
    else:
        a = a[:, :8]
    with pytest.raises(ValueError, match=match):
        base_score(hidden, ids, w, budget, a, pred.bias[0])
