"""base_fold (core/fold.py): base_plus's kept set, dropped slots folded by ExFold's pair statistics."""

import math

import pytest
import torch
from core_helpers import make_predictor, make_routing

from base_sglang.core import SelectionConfig, select_experts
from base_sglang.testing.predictors import random_predictor

E, K, H = 6, 2, 4


def hand_case(coef_row=None, loss_row=None):
    """Two tokens, experts 0-3 predicted large, 4-5 tiny: M = 3 keeps S = {0, 1, 2} and drops
    token 0's slot of expert 4 (weight 0.3). loss[4] ranks 3 (not in S), then 0 (token 0 runs it
    already), then 1, then 2."""
    pred = random_predictor(E, H, K, stats=True)
    pred.weight.zero_()
    pred.bias.copy_(torch.tensor([[2.0, 2.0, 2.0, 2.0, -5.0, -5.0]]))
    loss = torch.full((1, E, E), 0.99)
    loss[0, 4] = torch.tensor(loss_row or [0.1, 0.5, 0.8, 0.05, 1e30, 0.95])
    coef = torch.full((1, E, E), 0.5)
    coef[0, 4] = torch.tensor(coef_row or [0.9, 0.6, 0.7, 0.8, 1.0, 0.1])
    pred.exfold_loss, pred.exfold_coef = loss, coef
    logits = torch.tensor([[3.0, 0.0, 1.0, 2.5, 2.8, -1.0],
                           [0.0, 3.0, 2.5, 0.0, -1.0, -1.0]])
    ids = torch.tensor([[0, 4], [1, 2]])
    w = torch.tensor([[0.7, 0.3], [0.55, 0.45]])
    return logits, ids, w, torch.zeros(2, H), pred


def select(case, policy="base_fold", budget=3, **kw):
    logits, ids, w, hidden, pred = case
    return select_experts(logits, ids, w, hidden, torch.full((2,), budget), 0,
                          SelectionConfig(policy=policy, **kw), pred, norm_topk_prob=True)


def test_fold_picks_the_lowest_loss_kept_expert_not_in_the_tokens_slots():
    sel = select(hand_case(), renorm="never")
    # 3 (loss 0.05) is not kept, 0 (0.1) is token 0's own slot: expert 1 (0.5), weight 0.3 * 0.6
    assert sel.ids.tolist() == [[0, 1], [1, 2]]
    assert torch.allclose(sel.weights, torch.tensor([[0.7, 0.18], [0.55, 0.45]]))
    assert int(sel.stats.num_kept) == 3 and int(sel.stats.num_union) == 4


def test_partial_renormalises_only_the_unfolded_slots():
    sel = select(hand_case(), renorm="partial", renorm_alpha=0.5)
    kept = 0.7 * math.sqrt((1.0 - 0.18) / 0.7)  # ((W - F) / U) ** alpha on the kept slot
    assert sel.ids.tolist() == [[0, 1], [1, 2]]
    assert torch.allclose(sel.weights, torch.tensor([[kept, 0.18], [0.55, 0.45]]))
    always = select(hand_case(), renorm="always")
    assert torch.allclose(always.weights[0], torch.tensor([0.82, 0.18]))


def test_native_rule_is_partial():
    native = select(hand_case())
    explicit = select(hand_case(), renorm="partial")
    assert torch.equal(native.ids, explicit.ids) and torch.equal(native.weights, explicit.weights)


@pytest.mark.parametrize("row", [dict(coef_row=[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
                                 dict(coef_row=[0.9, -0.2, -0.1, 0.8, 1.0, 0.1]),
                                 dict(loss_row=[0.1, 1.0, 1.0, 0.05, 1e30, 0.95])])
def test_slot_is_dropped_without_a_useful_fold(row):
    never = select(hand_case(**row), renorm="never")
    assert never.ids.tolist() == [[0, -1], [1, 2]]
    assert torch.allclose(never.weights, torch.tensor([[0.7, 0.0], [0.55, 0.45]]))
    partial = select(hand_case(**row), renorm="partial", renorm_alpha=0.5)
    assert torch.allclose(partial.weights[0], torch.tensor([0.7 * math.sqrt(1.0 / 0.7), 0.0]))


def test_hybrid_backfills_when_the_fold_loss_is_above_the_threshold():
    case = hand_case()
    logits = case[0]
    p = torch.softmax(logits, -1)
    # best fold loss 0.5 >= 0.4: backfill token 0 with its next kept expert by logit: 2 (logit 1.0)
    sel = select(case, renorm="never", fold_max_loss=0.4, fold_fallback="backfill")
    assert sel.ids.tolist() == [[0, 2], [1, 2]]
    wb = float(p[0, 2] * 1.0 / (p[0, 0] + p[0, 4]))  # base_plus's "never" backfill weight
    assert torch.allclose(sel.weights, torch.tensor([[0.7, wb], [0.55, 0.45]]))
    same = select(case, renorm="never", fold_max_loss=0.6, fold_fallback="backfill")
    assert same.ids.tolist() == [[0, 1], [1, 2]]  # 0.5 < 0.6: folds as without the threshold
    plus = select(case, policy="base_plus", renorm="never")
    assert torch.equal(sel.ids, plus.ids) and torch.allclose(sel.weights, plus.weights)


def test_two_dropped_slots_fold_into_different_experts_heaviest_first():
    pred = random_predictor(E, H, 3, stats=True)
    pred.weight.zero_()
    pred.bias.copy_(torch.tensor([[2.0, 2.0, 2.0, -5.0, -5.0, -5.0]]))
    loss = torch.full((1, E, E), 0.9)
    loss[0, 3, 1], loss[0, 4, 1], loss[0, 4, 2] = 0.3, 0.2, 0.4  # both prefer 1
    coef = torch.full((1, E, E), 0.5)
    pred.exfold_loss, pred.exfold_coef = loss, coef
    logits = torch.zeros(1, E)
    ids = torch.tensor([[0, 3, 4]])
    w = torch.tensor([[0.5, 0.2, 0.3]])  # expert 4's slot is heavier: it gets 1, expert 3 gets 2
    other = (torch.tensor([[1, 2, 0]]), torch.tensor([[0.4, 0.4, 0.2]]))  # keeps 1, 2 in the union
    sel = select_experts(torch.cat([logits, logits]), torch.cat([ids, other[0]]),
                         torch.cat([w, other[1]]), torch.zeros(2, H), torch.full((2,), 3), 0,
                         SelectionConfig(policy="base_fold", renorm="never"), pred)
    assert sel.ids[0].tolist() == [0, 2, 1]
    assert torch.allclose(sel.weights[0], torch.tensor([0.5, 0.1, 0.15]))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("kw", [{}, dict(renorm="never"),
                                dict(fold_max_loss=0.5, fold_fallback="backfill")])
def test_equal_to_base_plus_when_nothing_is_dropped(seed, kw):
    T, E2, K2, H2 = 5, 24, 4, 8
    logits, ids, w = make_routing(T, E2, K2, seed=seed)
    pred = make_predictor(E2, H2, K2, seed=seed)
    hidden = torch.randn(T, H2, generator=torch.Generator().manual_seed(seed))
    union = len(set(ids.flatten().tolist()))
    assert union < E2 - 1
    for m in (union, union + 1, E2):  # every routed expert kept (E2: the dense path)
        b = torch.full((T,), m)
        fold = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_fold", **kw),
                              pred)
        plus = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_plus"), pred)
        assert torch.equal(fold.ids, plus.ids) and torch.equal(fold.weights, plus.weights)
        assert torch.equal(fold.ids, ids) and torch.equal(fold.weights, w)


def fold_ref(ids, w, kept: set[int], loss, coef):
    """ExFold-rule weights ("never", fallback drop) by explicit loops over each row's slots."""
    out_ids, out_w = [], []
    for t in range(ids.shape[0]):
        row_ids = [int(u) if int(u) in kept else -1 for u in ids[t]]
        row_w = [float(x) if int(u) in kept else 0.0 for u, x in zip(ids[t], w[t])]
        used = {u for u in row_ids if u >= 0}
        for j in sorted(range(ids.shape[1]), key=lambda j: (-float(w[t, j]), j)):
            u = int(ids[t, j])
            if u in kept:
                continue
            cands = [q for q in sorted(kept) if q not in used]
            if not cands:
                continue
            q = min(cands, key=lambda q: (float(loss[u, q]), q))
            if float(loss[u, q]) < 1.0 and float(coef[u, q]) > 0:
                row_ids[j], row_w[j] = q, float(w[t, j]) * float(coef[u, q])
                used.add(q)
        out_ids.append(row_ids)
        out_w.append(row_w)
    return torch.tensor(out_ids), torch.tensor(out_w)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("M", [2, 4, 7])
def test_matches_a_loop_reference_on_random_batches(seed, M):
    T, E2, K2, H2 = 10, 12, 3, 8
    logits, ids, w = make_routing(T, E2, K2, seed=seed)
    pred = make_predictor(E2, H2, K2, seed=seed)
    hidden = torch.randn(T, H2, generator=torch.Generator().manual_seed(seed))
    b = torch.full((T,), M)
    plus = select_experts(logits, ids, w, hidden, b, 0, SelectionConfig(policy="base_plus"), pred)
    sel = select_experts(logits, ids, w, hidden, b, 0,
                         SelectionConfig(policy="base_fold", renorm="never"), pred)
    kept = set(plus.ids[plus.ids >= 0].tolist())  # base_plus's kept set S
    assert len(kept) == M and int(sel.stats.num_kept) <= M
    assert set(sel.ids[sel.ids >= 0].tolist()) <= kept
    ref_ids, ref_w = fold_ref(ids, w, kept, pred.exfold_loss[0], pred.exfold_coef[0])
    assert torch.equal(sel.ids.long(), ref_ids)
    assert torch.allclose(sel.weights, ref_w, atol=1e-6)


def test_bad_knobs_and_missing_statistics_name_the_field():
    with pytest.raises(ValueError, match="fold_max_loss"):
        SelectionConfig(policy="base_fold", fold_max_loss=0.0)
    with pytest.raises(ValueError, match="fold_max_loss"):
        SelectionConfig(policy="base_fold", fold_max_loss=1.5)
    with pytest.raises(ValueError, match="fold_fallback"):
        SelectionConfig(policy="base_fold", fold_fallback="keep")
    case = hand_case()
    case[4].exfold_coef = None
    with pytest.raises(ValueError, match="exfold_coef"):
        select(case)
