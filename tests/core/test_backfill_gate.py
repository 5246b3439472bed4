"""backfill_min_share: a token refills only as many freed slots as it dropped routed slots heavier than
that share of its routed weight W (core/selection.py _backfill_limit)."""

import math

import pytest
import torch
from core_helpers import make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts

T, E, K, H = 12, 10, 4, 16


def routing(seed=0, norm_topk=True):
    logits, ids, w = make_routing(T, E, K, norm_topk=norm_topk, seed=seed)
    hidden = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1))
    return logits, ids, w, hidden, make_predictor(E, H, K, seed=seed)


def select(r, budget, norm_topk=True, **kw):
    logits, ids, w, hidden, pred = r
    return select_experts(logits, ids, w, hidden, torch.full((T,), budget), 0,
                          SelectionConfig(policy="base_plus", **kw), pred, norm_topk_prob=norm_topk)


def pairs(sel):
    """Per row, the sorted (id, weight) pairs of the executed slots (slot order aside)."""
    return [sorted((int(e), float(x)) for e, x in zip(i, w) if e >= 0)
            for i, w in zip(sel.ids, sel.weights)]


@pytest.mark.parametrize("M", [2, 4, 6, 8])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_zero_share_and_a_share_below_every_slot_are_todays_backfill_bit_exactly(M, norm_topk):
    for seed in (0, 1):
        r = routing(seed, norm_topk)
        today = select(r, M, norm_topk)
        for share in (0.0, 1e-9):  # 1e-9 takes the gated path: every dropped slot is heavier
            assert float((r[2] / r[2].sum(1, keepdim=True)).min()) > share
            gated = select(r, M, norm_topk, backfill_min_share=share)
            assert torch.equal(gated.ids, today.ids) and torch.equal(gated.weights, today.weights)
        assert ((today.ids >= 0).sum(1) == min(M, K)).all()  # every freed slot refilled while S lasts


@pytest.mark.parametrize("M", [1, 3, 5, 7, 9])
@pytest.mark.parametrize("norm_topk", [True, False])
def test_a_share_above_every_slot_is_backfill_off(M, norm_topk):
    r = routing(2, norm_topk)
    top = float((r[2] / r[2].sum(1, keepdim=True)).max())
    off = select(r, M, norm_topk, backfill=False)
    moved = (off.ids != r[1]).any(1)  # [T] rows that lost a slot
    assert moved.any()
    for share in (top + 1e-6, 1.0):
        gated = select(r, M, norm_topk, backfill_min_share=share)
        got, want = pairs(gated), pairs(off)
        for g, o in zip(got, want):
            assert [e for e, _ in g] == [e for e, _ in o]
            assert [x for _, x in g] == pytest.approx([x for _, x in o], rel=1e-6, abs=1e-9)
        assert torch.equal(gated.weights[~moved], r[2][~moved])  # unchanged rows keep w exactly
        assert torch.equal(gated.stats.num_kept, off.stats.num_kept)


def test_hand_built_slot_above_and_slot_below_the_share():
    """Token 0 routes to 0, 1, 2 (w 0.6, 0.3, 0.1); the kept set {0, 3, 4} drops 1 (share 0.3) and
    2 (share 0.1). At share 0.2 only one freed slot is refilled, by its next-preferred kept expert 3;
    at 0 both (3 and 4), at 0.35 none. Token 1 keeps its three experts untouched. oracle_plus
    (true norms, all 1, so D_u = sum w^2) runs the same backfill path with base_plus's combine rule."""
    logits = torch.tensor([[3.0, 2.3, 1.2, 1.0, 0.5, 0.1],
                           [0.8, -1.0, -1.0, 2.0, 1.5, -2.0]])
    ids = torch.tensor([[0, 1, 2], [3, 4, 0]])
    w = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.35, 0.15]])  # D: 0 .38, 3 .25, 4 .12, 1 .09, 2 .01

    def run(share):
        cfg = SelectionConfig(policy="oracle", renorm="partial", backfill_min_share=share)
        return select_experts(logits, ids, w, None, torch.full((2,), 3), 0, cfg,
                              routed_norms=torch.ones(2, 3))

    p = torch.softmax(logits[0].double(), -1)
    routed_p = float(p[0] + p[1] + p[2])
    for share, fill in ((0.0, [3, 4]), (0.2, [3]), (0.35, [])):
        sel = run(share)
        assert sel.ids[0].tolist() == [0, *fill] + [-1] * (2 - len(fill))
        never = [0.6] + [float(p[e]) / routed_p for e in fill]  # W = 1
        scale = (1.0 / sum(never)) ** 0.5
        want = [x * scale for x in never] + [0.0] * (2 - len(fill))
        assert sel.weights[0].tolist() == pytest.approx(want, rel=1e-6)
        assert torch.equal(sel.ids[1], ids[1]) and torch.equal(sel.weights[1], w[1])


@pytest.mark.parametrize("share", [-0.01, 1.0001, math.nan, math.inf])
def test_share_out_of_range_names_the_field(share):
    with pytest.raises(ValueError, match="backfill_min_share"):
        SelectionConfig(policy="base_plus", backfill_min_share=share)


def test_default_share_is_zero():
    assert SelectionConfig(policy="base_plus").backfill_min_share == 0.0
