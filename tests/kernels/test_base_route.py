"""base_route_select (softmax top-k + BASE in one launch, from a folded router GEMM) == the core.

The oracle is core.routing.route_select: the same top-k in torch, then select_experts with the
folded GEMM's log-norms. Runs under the CPU interpreter without a GPU.
"""

import pytest
import torch
import triton
import triton.language as tl
from kernel_helpers import DEVICE
from route_helpers import check_route, folded_scores

from base_sglang.core import SelectionConfig
from base_sglang.core.routing import softmax_topk
from base_sglang.kernels import base_route_select, route_select_experts
from base_sglang.kernels.base_fused import slot_sum


@pytest.mark.parametrize("T,E,K,M", [
    (16, 128, 8, 16),  # Qwen3-30B-A3B's router at a decode batch of 16
    (1, 128, 8, 5),  # one row: one warp, K max-reductions, the narrow backfill
    (40, 64, 8, 24),  # several row programs, each recomputing D over every chunk
    (9, 60, 6, 10),  # E and K not powers of two
    (7, 32, 4, 0),  # M = 0: every routed expert dropped
    (5, 16, 16, 9),  # K == E
    (3, 8, 2, 3),  # Mixtral's router
])
def test_shapes(T, E, K, M):
    got, _, ids, _ = check_route(T, E, K, [M] * T, seed=T + E)
    if M == 0:
        assert (got.ids == -1).all() and (got.weights == 0).all()
    kept = got.ids[got.ids >= 0].unique()
    assert len(kept) == int(got.stats.num_kept) <= max(M, 0)


@pytest.mark.parametrize("policy,renorm,norm", [
    ("base_plus", "native", True), ("base_plus", "native", False),  # partial combine
    ("base", "native", True), ("base", "native", False),  # always / never
    ("base", "never", True), ("base_plus", "always", False),
])
def test_combine_rules_and_routers(policy, renorm, norm):
    check_route(12, 32, 4, [5, 9, -1, 6, 6, 2, 8, 5, 3, 7, 5, 4], policy=policy, renorm=renorm,
                norm=norm, seed=3)


@pytest.mark.parametrize("budget", [[64] * 6, [3, 64, 2, 1, 4, 2], [-1, 5, 5, -1, 5, 5]])
def test_dense_rows_and_padding(budget):
    got, want, ids, w = check_route(6, 64, 6, budget, seed=5)
    real = torch.as_tensor(budget).to(DEVICE) >= 0
    assert (got.ids[~real] == -1).all() and (got.weights[~real] == 0).all()
    if max(budget) >= 64:  # a dense row: nothing dropped, the router's routing as it is
        assert torch.equal(got.ids[real].long(), ids[real])
        torch.testing.assert_close(got.weights[real], w[real], rtol=0, atol=1e-6)


def test_drop_only():
    check_route(10, 32, 4, [6] * 10, backfill=False, seed=2)


def test_ties_break_to_the_lower_id():
    check_route(12, 32, 4, [6] * 12, ties=True, seed=0)
    check_route(12, 32, 4, [6] * 12, ties=True, seed=0, dtype=torch.float32)


def test_base_sched_reads_the_layer_table():
    E = 16
    table = [0, 1, 3, 2, 6, 9, 5, 7, 8, 12, 10, 11, 12, 13, 14, 15, 16]
    got, *_ = check_route(6, E, 4, [2, 5, -1, 4, 4, 1], policy="base_sched", seed=11, table=table)
    assert int(got.stats.num_kept) == min(table[5], int(got.stats.num_union))


@pytest.mark.parametrize("norm", [True, False])
def test_topk_alone_is_the_routers_topk(norm):
    T, E, K = 11, 64, 8
    scores, _ = folded_scores(T, E, 16, seed=9)
    budget = torch.tensor([4] * 10 + [-1]).to(DEVICE)
    ids, w, _, _ = base_route_select(scores[:, :E], None, None, budget, top_k=K, renormalize=norm)
    want_w, want_ids = softmax_topk(scores[:, :E], K, norm)
    assert torch.equal(ids[:10].long(), want_ids[:10])
    torch.testing.assert_close(w[:10], want_w[:10], rtol=0, atol=1e-6)
    assert (ids[10] == -1).all() and (w[10] == 0).all()


def test_bad_inputs_name_the_field():
    scores, pred = folded_scores(4, 16, 8)
    budget = torch.full((4,), 3).to(DEVICE)
    with pytest.raises(ValueError, match="top_k"):
        base_route_select(scores[:, :16], None, None, budget, top_k=17, renormalize=True)
    with pytest.raises(ValueError, match="yhat"):
        base_route_select(scores[:, :16], scores[:, :8], pred.bias[0], budget, top_k=4,
                          renormalize=True)
    with pytest.raises(ValueError, match="budget"):
        base_route_select(scores[:, :16], None, None, budget[:3], top_k=4, renormalize=True)
    with pytest.raises(ValueError, match="folded"):
        route_select_experts(scores[:, :16], scores[:, 16:], budget, 0,
                             SelectionConfig(policy="oea"), pred, top_k=4, norm_topk_prob=True)


# warps, rows per block, iterative top-k[, D through the scratch row (default 1)]
@pytest.mark.parametrize("tiles", ["4,16,1", "1,4,0", "2,2,1", "2,4,0,0", "4,16,1,0"])
@pytest.mark.parametrize("T,budget", [(9, 10), (12, 5), (3, 64)])
def test_every_tiling_and_topk_method(tiles, T, budget, monkeypatch):
    # rows per block below T: several programs, each recomputing D over every chunk
    monkeypatch.setenv("BASE_ROUTE_TILES", tiles)
    check_route(T, 64, 8, [budget] * (T - 1) + [-1], seed=T)
    check_route(T, 32, 4, [budget] * T, seed=T, dtype=torch.float32, policy="base")


@pytest.mark.parametrize("tiles", ["8,16", "x,16,0", "3,16,0", "8,0,1", "8,16,0,1,16,1", "8,16,0,1,-8"])
def test_bad_tile_override_names_the_variable(tiles, monkeypatch):
    monkeypatch.setenv("BASE_ROUTE_TILES", tiles)
    with pytest.raises(ValueError, match="BASE_ROUTE_TILES"):
        check_route(4, 16, 4, [3] * 4)


def test_nothing_to_drop_keeps_the_routing():
    # M >= the union (T = 2, K = 4, M = 8): the launch returns the routing, S = the union
    got, _, ids, w = check_route(2, 64, 4, [8, 8], seed=4)
    assert torch.equal(got.ids.long(), ids)
    assert int(got.stats.num_kept) == int(got.stats.num_union) == len(ids.unique())
    assert float(got.stats.removed_cost) == 0.0


@pytest.mark.parametrize("kernel", ["fused", "two"])
def test_topk_launch_then_the_unfolded_selection_on_strided_logits(kernel, monkeypatch):
    # what a folded plugin block runs where route_wins is false: our top-k launch on the GEMM's
    # first E columns (a strided view), then base_select_experts on the same view
    from base_sglang.core import select_experts
    from base_sglang.kernels import base_select_experts

    monkeypatch.setenv("BASE_SELECT_KERNEL", kernel)
    T, E, K, H = 10, 128, 8, 32
    scores, pred = folded_scores(T, E, H, seed=21)
    logits = scores[:, :E]
    assert logits.stride() == (2 * E, 1)
    z = torch.randn(T, H, generator=torch.Generator().manual_seed(22)).bfloat16().to(DEVICE)
    budget = torch.tensor([12] * 9 + [-1]).to(DEVICE)
    ids, w, _, _ = base_route_select(logits, None, None, budget, top_k=K, renormalize=True)
    cfg = SelectionConfig(policy="base_plus")
    got = base_select_experts(logits, ids, w, z, budget, 0, cfg, pred, norm_topk_prob=True)
    want = select_experts(logits.contiguous(), ids.long(), w, z, budget, 0, cfg, pred,
                          norm_topk_prob=True)
    assert torch.equal(got.ids.long(), want.ids)
    torch.testing.assert_close(got.weights, want.weights, rtol=0, atol=1e-6)


def _route_with_tiles(tiles, monkeypatch, T, E, K, budget, **kw):
    monkeypatch.setenv("BASE_ROUTE_TILES", tiles)
    return check_route(T, E, K, budget, **kw)[0]


# |S| at, below and above the narrow tile's width (32 here: E = 64, union of 12 rows x K = 8 above
# 33), M < K, M = 0, padded rows, a dense row; ties on a coarse grid
@pytest.mark.parametrize("budget", [[32] * 12, [31] * 12, [33] * 12, [3] * 12, [0] * 12,
                                    [-1, 20, 9, -1, 32, 5, 5, -1, 1, 2, 3, 4], [64] + [5] * 11])
@pytest.mark.parametrize("ties", [False, True])
def test_narrow_backfill_is_the_full_tiles_result(budget, ties, monkeypatch):
    # the narrow backfill (S's columns gathered into a [BT, 32] tile) against the same tiles with it
    # off (compact 0), both against the core: ids, weights, counts and removed cost all equal
    T, E, K = 12, 64, 8
    off = _route_with_tiles("4,16,0,1,0", monkeypatch, T, E, K, budget, ties=ties, seed=31)
    on = _route_with_tiles("4,16,0,1,32", monkeypatch, T, E, K, budget, ties=ties, seed=31)
    assert torch.equal(on.ids, off.ids) and torch.equal(on.weights, off.weights)
    assert int(on.stats.num_kept) == int(off.stats.num_kept) <= max(max(budget), 0)
    assert torch.equal(on.stats.removed_cost, off.stats.removed_cost)


@pytest.mark.parametrize("tiles,dtype,policy,M", [
    *[("4,16,1,1,16", torch.bfloat16, "base_plus", M) for M in (7, 16, 17)],  # K max-reductions
    # int64 keys; width 8 = next_pow2(K), the least allowed: M = 7 narrow, 16 and 17 the full tile
    *[("4,16,0,1,8", torch.float32, "base", M) for M in (7, 16, 17)],
    ("2,4,0,1,16", torch.bfloat16, "base_plus", 16),  # several programs, D over every chunk
    ("2,4,0,1,16", torch.bfloat16, "base_plus", 17),
    ("2,4,0,0,16", torch.float32, "base", 7),  # no scratch row
])
def test_narrow_backfill_variants(tiles, dtype, policy, M, monkeypatch):
    T, E, K = 12, 64, 8
    on = _route_with_tiles(tiles, monkeypatch, T, E, K, [M] * 11 + [-1], dtype=dtype, policy=policy,
                           seed=M)
    off = _route_with_tiles(tiles.rsplit(",", 1)[0] + ",0", monkeypatch, T, E, K, [M] * 11 + [-1],
                            dtype=dtype, policy=policy, seed=M)
    assert torch.equal(on.ids, off.ids) and torch.equal(on.weights, off.weights)
    assert (on.ids[-1] == -1).all() and (on.weights[-1] == 0).all()


@pytest.mark.parametrize("K", [4, 16])  # combine's slot sums slot by slot (SLOT_R -1)
def test_narrow_backfill_other_k(K, monkeypatch):
    T, E = 10, 64
    on = _route_with_tiles("4,16,0,1,16", monkeypatch, T, E, K, [12] * T, seed=K)
    off = _route_with_tiles("4,16,0,1,0", monkeypatch, T, E, K, [12] * T, seed=K)
    assert torch.equal(on.ids, off.ids) and torch.equal(on.weights, off.weights)


def test_narrow_backfill_under_a_schedule(monkeypatch):
    # base_sched maps the batch budget through the table: 40 -> 6 (narrow), 12 -> 33 (full tile)
    E = 64
    table = list(range(E + 1))
    table[40], table[12] = 6, 33
    for b in (40, 12):
        got = _route_with_tiles("4,16,0,1,32", monkeypatch, 10, E, 8, [b] * 10, policy="base_sched",
                                seed=b, table=table)
        assert int(got.stats.num_kept) == min(table[b], int(got.stats.num_union))


def test_compact_width():
    from base_sglang.kernels.base_route import compact_width
    assert compact_width(32, 128, 8) == 32 and compact_width(20, 128, 8) == 32
    assert compact_width(4, 128, 8) == 8  # at least the top-k's width
    assert compact_width(32, 32, 8) == 0 and compact_width(0, 128, 8) == 0  # not narrower: off


def test_slot_order_of_the_default_tilings():
    # the runs of adjacent slots per thread that the router's tile left before the narrow path
    # (sm_90, Triton 3.6 layouts): 4 at Qwen3 T = 1 (one warp, [1, 128]), 2 at OLMoE T = 1, 8 at T = 16
    from base_sglang.kernels.base_route import route_blocks
    assert route_blocks(1, 128, 8)["SLOT_R"] == 4 and route_blocks(1, 64, 8)["SLOT_R"] == 2
    assert route_blocks(16, 128, 8)["SLOT_R"] == 8 and route_blocks(8, 64, 8)["SLOT_R"] == 4
    assert route_blocks(16, 8, 2)["SLOT_R"] == 0 and route_blocks(16, 64, 4)["SLOT_R"] == -1


@triton.jit
def _slot_sum_kernel(x_ptr, out_ptr, R: tl.constexpr):
    r = tl.arange(0, 4)
    x = tl.load(x_ptr + r[:, None] * 8 + tl.arange(0, 8)[None, :])
    tl.store(out_ptr + r, slot_sum(x, R))


def test_slot_sum_orders():
    # combine_rows' slot sums in a fixed order (base_fused.slot_sum): values where the association
    # shows (1e8 + 1 - 1e8 is 0 or 1 in fp32 depending on it), each order checked against numpy
    import numpy as np

    x = np.array([[1e8, 1, -1e8, 1, 3, -3, 1e-3, 7],
                  [1, 1e8, 1, -1e8, 1, 1, 1e8, -1e8],
                  [-1e8, 1e8, 1, 1, 1e8, 1, 1, -1e8],
                  [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]], dtype=np.float32)
    f = np.float32
    def seq(v):
        acc = f(v[0])
        for y in v[1:]:
            acc = f(acc + f(y))
        return acc
    want = {8: [seq(r) for r in x],
            4: [f(seq(r[:4]) + seq(r[4:])) for r in x],
            2: [f(f(f(r[0] + r[1]) + f(r[4] + r[5])) + f(f(r[2] + r[3]) + f(r[6] + r[7]))) for r in x],
            1: [f(f(f(r[0] + r[4]) + f(r[2] + r[6])) + f(f(r[1] + r[5]) + f(r[3] + r[7]))) for r in x]}
    assert len({tuple(v) for v in want.values()}) == 4  # the orders differ on these rows
    want[-1] = want[8]  # slot by slot
    xt = torch.from_numpy(x).to(DEVICE)
    for R, w in want.items():
        out = torch.empty(4, dtype=torch.float32, device=DEVICE)
        _slot_sum_kernel[(1,)](xt, out, R=R)
        assert out.cpu().numpy().tolist() == [float(v) for v in w], R
