"""base_fused_select (the one-launch selection) == the core, at the cases only it has.

Under the CPU interpreter the kernel runs as its two phases (ROLE 1 then 2) with the code the GPU
runs; the grid barrier itself is checked on the H200 (benchmarks/check_kernels_gpu.py --only fused).
"""

import pytest
import torch
from kernel_helpers import DEVICE, compare_with_core, predictor, routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.kernels import base_fused_select, selection_kernel
from base_sglang.kernels.select_experts import FUSED_MAX_T, FUSED_MIN_E


@pytest.fixture(autouse=True)
def fused(monkeypatch):
    monkeypatch.setenv("BASE_SELECT_KERNEL", "fused")


@pytest.mark.parametrize("T,E,K,budget", [
    (24, 128, 8, 24),  # several row programs, E programs score
    (40, 8, 2, 3),  # more row programs than experts: programs past E only build rows
    (9, 60, 6, 10),  # E and K not powers of two
    (7, 32, 4, 0),  # M = 0: every routed expert dropped
    (5, 16, 16, 9),  # K == E
])
def test_shapes(T, E, K, budget):
    got, _ = compare_with_core(T, E, K, [budget] * T, policy="base_plus", H=40, seed=T + E)
    if budget == 0:
        assert (got.ids == -1).all() and (got.weights == 0).all()


@pytest.mark.parametrize("kernel", ["fused", "two"])
@pytest.mark.parametrize("budgets", [[5] * 6, [2, 9, -1, 4, 4, 1], [16] + [3] * 5])
def test_base_sched_reads_the_layer_table(kernel, budgets, monkeypatch):
    monkeypatch.setenv("BASE_SELECT_KERNEL", kernel)
    E = 16
    # not monotone in M (as calibrated tables are not): the batch budget is mapped, not each row's
    table = [0, 1, 3, 2, 6, 9, 5, 7, 8, 12, 10, 11, 12, 13, 14, 15, 16]
    got, _ = compare_with_core(6, E, 4, budgets, policy="base_sched", H=24, seed=11, table=table)
    m = max(b for b in budgets if b >= 0)
    want_kept = E if m >= E else table[m]
    assert int(got.stats.num_kept) == min(want_kept, int(got.stats.num_union))


@pytest.mark.parametrize("kernel", ["fused", "two"])
@pytest.mark.parametrize("T, r", [(3, 0), (4, 1), (6, 1), (7, 2), (12, 2)])
def test_base_sched_gets_the_table_of_its_batch_size_range(kernel, T, r, monkeypatch):
    # one table per batch-size range (rows 1-3, 4-6, 7+): the host hands the kernel the [E+1] row
    # of the range of T rows, as the core picks it; at M = 2 the ranges run 2, 5 and 9 experts
    monkeypatch.setenv("BASE_SELECT_KERNEL", kernel)
    E = 16
    tables = torch.arange(E + 1).repeat(3, 1)  # [R, E+1]
    tables[:, 2] = torch.tensor([2, 5, 9])
    got, (_, ids, _) = compare_with_core(T, E, 6, [2] * T, policy="base_sched", H=24, seed=T,
                                         table=tables, bounds=[3, 6])
    assert len(set(ids.flatten().tolist())) >= 9  # so the kept count tells the ranges apart
    assert int(got.stats.num_kept) == [2, 5, 9][r]


def test_tied_logits_and_scores_break_to_the_lower_id():
    # logits on a coarse grid (many exact ties, +0.0 and -0.0 among them) and identical predictor
    # rows for half the experts (tied batch scores): backfill and top-M both break ties by lower id
    T, E, K, H = 12, 32, 4, 16
    g = torch.Generator().manual_seed(0)
    logits = (torch.randint(-3, 4, (T, E), generator=g) * 0.5).float()
    logits[0, :8] = torch.tensor([0.0, -0.0] * 4)
    w, ids = torch.softmax(logits, -1).topk(K, -1)
    w = w / w.sum(-1, keepdim=True)
    pred = predictor(E, H, seed=1)
    pred.weight[0, E // 2:] = pred.weight[0, 0]
    pred.bias[0, E // 2:] = pred.bias[0, 0]
    hidden = torch.randn(T, H, generator=g).bfloat16()
    budget = torch.full((T,), 6)
    cfg = SelectionConfig(policy="base_plus")
    args = [x.to(DEVICE) for x in (logits, ids, w, hidden, budget)]
    want = select_experts(*args, 0, cfg, pred)
    got = base_fused_select(args[3], args[1], args[2], args[0], args[4], pred.weight[0],
                            pred.bias[0], combine="partial", alpha=cfg.renorm_alpha)
    assert torch.equal(got[0], want.ids)
    torch.testing.assert_close(got[1], want.weights, rtol=0, atol=1e-6)


def test_minus_one_slots_in_the_input_stay_dropped():
    logits, ids, w = routing(6, 16, 4, seed=2)
    ids[1, 2] = -1  # a slot an earlier pass already dropped
    w[1, 2] = 0.0
    pred = predictor(16, 24)
    hidden = torch.randn(6, 24, device=DEVICE).bfloat16()
    budget = torch.full((6,), 16, device=DEVICE)
    got = base_fused_select(hidden, ids, w, logits, budget, pred.weight[0], pred.bias[0])
    want = select_experts(logits, ids, w, hidden, budget, 0, SelectionConfig(policy="base"), pred)
    assert torch.equal(got[0], want.ids)


def test_dispatch_by_shape(monkeypatch):
    monkeypatch.delenv("BASE_SELECT_KERNEL")
    assert selection_kernel(1, FUSED_MIN_E) == "fused"
    assert selection_kernel(FUSED_MAX_T, 128) == "fused"
    assert selection_kernel(FUSED_MAX_T + 1, 128) == "two"
    assert selection_kernel(16, FUSED_MIN_E - 1) == "two"
    monkeypatch.setenv("BASE_SELECT_KERNEL", "two")
    assert selection_kernel(1, 128) == "two"
    monkeypatch.setenv("BASE_SELECT_KERNEL", "fast")
    with pytest.raises(ValueError, match="BASE_SELECT_KERNEL"):
        selection_kernel(1, 128)


@pytest.mark.parametrize("bad,match", [("combine", "combine: must be one of"),
                                       ("alpha", "alpha: must be in"),
                                       ("a_shape", "a: expected")])
def test_contract_errors(bad, match):
    logits, ids, w = routing(4, 8, 2)
    pred = predictor(8, 16)
    hidden = torch.randn(4, 16, device=DEVICE)
    budget = torch.full((4,), 3, device=DEVICE)
    a = pred.weight[0][:, :8] if bad == "a_shape" else pred.weight[0]
    kw = {"combine": "sometimes"} if bad == "combine" else {"alpha": 1.5} if bad == "alpha" else {}
    with pytest.raises(ValueError, match=match):
        base_fused_select(hidden, ids, w, logits, budget, a, pred.bias[0], **kw)
