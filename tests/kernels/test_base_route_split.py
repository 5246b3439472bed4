"""base_route_split (the folded route-select in two launches) == the core, and == the one-launch
kernel bit for bit at the same rows per program (the same chunk sums of D, the same combine).

Runs under the CPU interpreter without a GPU; BASE_ROUTE=split sends route_select_experts there.
"""

import pytest
import torch
from kernel_helpers import DEVICE
from route_helpers import check_route, folded_scores

from base_sglang.core import SelectionConfig
from base_sglang.kernels import base_route_split, route_mode, route_select_experts, route_wins
from base_sglang.kernels.base_route_split import split_blocks


@pytest.fixture
def split(monkeypatch):
    monkeypatch.setenv("BASE_ROUTE", "split")
    return monkeypatch


@pytest.mark.parametrize("T,E,K,M", [
    (64, 128, 8, 16),  # Qwen3-30B-A3B's router at a decode batch of 64: 16 programs of 4 rows
    (8, 128, 8, 16),  # at 8 rows, where the H100's rule starts the two launches: 2 programs of 4
    (33, 64, 8, 24),  # OLMoE's, a partial last chunk
    (1, 128, 8, 5),  # one row
    (9, 60, 6, 10),  # E and K not powers of two
    (7, 32, 4, 0),  # M = 0: every routed expert dropped
    (5, 16, 16, 9),  # K == E
    (3, 8, 2, 3),  # Mixtral's router
])
def test_shapes(T, E, K, M, split):
    got, _, ids, _ = check_route(T, E, K, [M] * T, seed=T + E)
    if M == 0:
        assert (got.ids == -1).all() and (got.weights == 0).all()
    kept = got.ids[got.ids >= 0].unique()
    assert len(kept) == int(got.stats.num_kept) <= max(M, 0)
    assert int(got.stats.num_kept) == min(M, int(got.stats.num_union))


@pytest.mark.parametrize("policy,renorm,norm,backfill", [
    ("base_plus", "native", True, True), ("base_plus", "native", False, True),  # partial combine
    ("base", "native", True, True), ("base", "native", False, True),  # always / never
    ("base_plus", "always", False, True), ("base_plus", "native", True, False),  # drop only
])
def test_combine_rules_routers_and_drop_only(policy, renorm, norm, backfill, split):
    check_route(20, 32, 4, [5, 9, -1, 6, 6, 2, 8, 5, 3, 7, 5, 4] + [6] * 8, policy=policy,
                renorm=renorm, norm=norm, backfill=backfill, seed=3)


@pytest.mark.parametrize("budget", [[64] * 12, [3, 64] + [2] * 10, [-1, 5, 5, -1] * 3])
def test_dense_rows_and_padding(budget, split):
    got, _, ids, w = check_route(12, 64, 6, budget, seed=5)
    real = torch.as_tensor(budget).to(DEVICE) >= 0
    assert (got.ids[~real] == -1).all() and (got.weights[~real] == 0).all()
    if max(budget) >= 64:  # nothing dropped: launch 1's routing as it is, launch 2 writes no row
        assert torch.equal(got.ids[real].long(), ids[real])
        torch.testing.assert_close(got.weights[real], w[real], rtol=0, atol=1e-6)
        assert float(got.stats.removed_cost) == 0.0


def test_ties_break_to_the_lower_id(split):
    check_route(20, 32, 4, [6] * 20, ties=True, seed=0)
    check_route(20, 32, 4, [6] * 20, ties=True, seed=0, dtype=torch.float32)  # int64 keys


def test_base_sched_reads_the_layer_table(split):
    E = 16
    table = [0, 1, 3, 2, 6, 9, 5, 7, 8, 12, 10, 11, 12, 13, 14, 15, 16]
    got, *_ = check_route(18, E, 4, [2, 5, -1, 4, 4, 1] * 3, policy="base_sched", seed=11,
                          table=table)
    assert int(got.stats.num_kept) == min(table[5], int(got.stats.num_union))


# block_t, warps1, warps2[, iter[, compact]]: |S| <= compact runs the narrow backfill
@pytest.mark.parametrize("tiles", ["8,4,4", "2,1,2", "16,8,4,1", "4,2,2,0,0", "1,1,1,1,16"])
@pytest.mark.parametrize("M", [5, 40])
def test_every_tiling(tiles, M, split):
    split.setenv("BASE_ROUTE_SPLIT_TILES", tiles)
    check_route(24, 64, 8, [M] * 23 + [-1], seed=M)


@pytest.mark.parametrize("T,M,dtype", [(24, 24, torch.bfloat16), (24, 40, torch.float32),
                                       (16, 12, torch.bfloat16)])
def test_equals_the_one_launch_kernel_bitwise(T, M, dtype, monkeypatch):
    # at the one launch's tiling (E = 64: 16 rows per program, 4 warps) both sum the same chunk
    # shares of D in the same order and run the same _kept_rows: ids, weights and stats equal
    E, K = 64, 8
    budget = [M] * (T - 1) + [-1]
    monkeypatch.setenv("BASE_ROUTE", "fold")
    one = check_route(T, E, K, budget, dtype=dtype, seed=T)[0]
    monkeypatch.setenv("BASE_ROUTE", "split")
    monkeypatch.setenv("BASE_ROUTE_SPLIT_TILES", "16,4,4")
    two = check_route(T, E, K, budget, dtype=dtype, seed=T)[0]
    assert torch.equal(one.ids, two.ids) and torch.equal(one.weights, two.weights)
    assert int(one.stats.num_kept) == int(two.stats.num_kept)
    assert torch.equal(one.stats.removed_cost, two.stats.removed_cost)


def test_repeat_calls_are_bitwise_equal(split):
    T, E, K = 16, 128, 8
    scores, pred = folded_scores(T, E, 16, seed=4)
    budget = torch.tensor([10] * T).to(DEVICE)
    outs = [base_route_split(scores[:, :E], scores[:, E:], pred.bias[0], budget, top_k=K,
                             renormalize=True, combine="partial") for _ in range(2)]
    for o in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(outs[0], o))


def test_bad_inputs_name_the_field(split):
    scores, pred = folded_scores(4, 16, 8)
    budget = torch.full((4,), 3).to(DEVICE)
    b = pred.bias[0]
    with pytest.raises(ValueError, match="top_k"):
        base_route_split(scores[:, :16], scores[:, 16:], b, budget, top_k=17, renormalize=True)
    with pytest.raises(ValueError, match="yhat"):
        base_route_split(scores[:, :16], scores[:, :8], b, budget, top_k=4, renormalize=True)
    with pytest.raises(ValueError, match="yhat"):
        base_route_split(scores[:, :16], None, b, budget, top_k=4, renormalize=True)
    with pytest.raises(ValueError, match="budget"):
        base_route_split(scores[:, :16], scores[:, 16:], b, budget[:3], top_k=4, renormalize=True)
    with pytest.raises(ValueError, match="folded"):
        route_select_experts(scores[:, :16], scores[:, 16:], budget, 0,
                             SelectionConfig(policy="oea"), pred, top_k=4, norm_topk_prob=True)


@pytest.mark.parametrize("tiles", ["8", "x,4,4", "0,4,4", "8,3,4", "8,4,4,0,-1", "8,4,4,0,1,1"])
def test_bad_tile_override_names_the_variable(tiles, split):
    split.setenv("BASE_ROUTE_SPLIT_TILES", tiles)
    with pytest.raises(ValueError, match="BASE_ROUTE_SPLIT_TILES"):
        split_blocks(16, 64, 8)


def test_route_mode_override(monkeypatch):
    monkeypatch.delenv("BASE_ROUTE", raising=False)
    # the measured rule: one launch below SPLIT_MIN_T rows (32), two up to SPLIT_MAX_T (128), the
    # unfolded path above
    assert [route_mode(T, 128) for T in (1, 8, 16, 31, 32, 64, 128, 129)] == \
        ["fold", "fold", "fold", "fold", "split", "split", "split", "unfold"]
    assert route_wins(16, 64) and not route_wins(256, 64)
    for mode in ("fold", "split", "unfold"):
        monkeypatch.setenv("BASE_ROUTE", mode)
        assert route_mode(64, 128) == mode and route_wins(64, 128) == (mode != "unfold")
    monkeypatch.setenv("BASE_ROUTE", "two")
    with pytest.raises(ValueError, match="BASE_ROUTE"):
        route_mode(8, 64)
