"""Per-layer schedules per batch-size range: the file format, the range pick, the core's table."""

import pytest
import torch
from core_helpers import make_routing

from base_sglang.core import Predictor, PredictorMismatch, SelectionConfig, select_experts
from base_sglang.testing.predictors import random_predictor

E, H, K = 6, 8, 2


def _pred(layers=(0,), **kw) -> Predictor:
    p = random_predictor(E, H, K, layers, num_layers=max(layers) + 1, seed=0,
                         architecture="synthetic")
    return Predictor(meta=p.meta, weight=p.weight, bias=p.bias, **kw)


def _ident(R=3, L=1):
    return torch.arange(E + 1, dtype=torch.float32).expand(R, L, E + 1).clone()  # [R, L, E+1]


# ---- format: parse and validate once, errors name the field ---------------------------------
@pytest.mark.parametrize("table, bounds, match", [
    (_ident(3), None, "'layer_budget' holds 3 tables .* 'layer_budget_max_batch' is missing"),
    (_ident(3), torch.tensor([4.0]), r"'layer_budget_max_batch' has shape \(1,\), expected \(2,\)"),
    (_ident(3), torch.tensor([[4.0, 8.0]]), "'layer_budget_max_batch' has shape"),
    (_ident(3), torch.tensor([4.0, 4.0]), "'layer_budget_max_batch' must be strictly ascending"),
    (_ident(3), torch.tensor([8.0, 4.0]), "must be strictly ascending, got \\[8, 4\\]"),
    (_ident(3), torch.tensor([0.0, 4.0]), "'layer_budget_max_batch' must hold integers >= 1"),
    (_ident(3), torch.tensor([2.5, 4.0]), "'layer_budget_max_batch' must hold integers >= 1"),
    (_ident(3), torch.tensor([float("inf"), 4.0]), "must hold integers >= 1"),
    (None, torch.tensor([4.0]), "'layer_budget_max_batch' is given without 'layer_budget'"),
    (_ident(2, L=2), torch.tensor([4.0]), r"'layer_budget' has shape \(2, 2, 7\), expected \(2, 1, 7\)"),
    (torch.zeros(0, 1, E + 1), torch.zeros(0), r"'layer_budget' has shape \(0, 1, 7\)"),
    (torch.zeros(2, 2, 1, E + 1), None, r"'layer_budget' has shape \(2, 2, 1, 7\)"),
    (torch.zeros(1, E), None, r"'layer_budget' has shape \(1, 6\), expected \(1, 7\)"),
    (torch.full((1, E + 1), 0.5), None, "'layer_budget' must hold integers in 0..6"),
    (torch.full((2, 1, E + 1), 7.0), torch.tensor([3.0]), "'layer_budget' must hold integers in 0..6"),
    (torch.full((1, E + 1), -1.0), None, "'layer_budget' must hold integers in 0..6"),
])
def test_bad_schedules_are_refused_naming_the_field(table, bounds, match):
    with pytest.raises(PredictorMismatch, match=match):
        _pred(layer_budget=table, layer_budget_max_batch=bounds)


def test_multi_range_file_round_trips_and_old_files_are_one_open_range(tmp_path):
    table = _ident(3)
    table[1, 0, 2], table[2, 0, 2] = 3, 4
    p = _pred(layer_budget=table, layer_budget_max_batch=torch.tensor([4.0, 9.0]))
    p.save(tmp_path / "m.safetensors")
    q = Predictor.load(tmp_path / "m.safetensors")
    assert q.layer_budget.shape == (3, 1, E + 1) and torch.equal(q.layer_budget, table)
    assert q.schedule_bounds == (4, 9)
    assert [int(q.layer_schedule(0, b)[2]) for b in (1, 4, 5, 9, 10)] == [2, 2, 3, 3, 4]
    old = _pred(layer_budget=table[2])  # the single-table [L, E+1] format of the q3 files
    old.save(tmp_path / "o.safetensors")
    o = Predictor.load(tmp_path / "o.safetensors")
    assert o.layer_budget.shape == (1, E + 1) and o.schedule_bounds == ()
    assert all(o.schedule_range(b) == 0 for b in (1, 16, 10**6))
    assert torch.equal(o.layer_schedule(0, 64), table[2, 0])
    one = _pred(layer_budget=table[:1], layer_budget_max_batch=torch.zeros(0))  # R = 1, 3-D
    assert one.schedule_bounds == () and torch.equal(one.layer_schedule(0, 5), table[0, 0])


def test_bad_file_is_refused_at_load(tmp_path):
    from safetensors.torch import load_file, save_file

    _pred(layer_budget=_ident(2), layer_budget_max_batch=torch.tensor([4.0])).save(tmp_path / "a")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "a"), framework="pt") as f:
        meta = f.metadata()
    tensors = load_file(str(tmp_path / "a"))
    del tensors["layer_budget_max_batch"]
    save_file(tensors, str(tmp_path / "b"), metadata=meta)
    with pytest.raises(PredictorMismatch, match="'layer_budget_max_batch' is missing"):
        Predictor.load(tmp_path / "b")


def test_bounds_stay_on_the_host_when_the_predictor_moves():
    p = _pred(layer_budget=_ident(3), layer_budget_max_batch=torch.tensor([4.0, 9.0]))
    m = p.to("meta")
    assert m.layer_budget.device.type == "meta" and m.layer_budget_max_batch.device.type == "cpu"
    assert m.schedule_bounds == (4, 9) and m.schedule_range(5) == 1


# ---- the range pick at its boundaries ----------------------------------------------------------
@pytest.mark.parametrize("rows, r", [(0, 0), (1, 0), (11, 0), (12, 1), (31, 1), (32, 1), (33, 2),
                                     (64, 2), (4096, 2)])
def test_range_pick_at_the_boundaries(rows, r):
    p = _pred(layer_budget=_ident(3), layer_budget_max_batch=torch.tensor([11.0, 32.0]))
    assert p.schedule_range(rows) == r


def test_a_table_assigned_later_is_validated_and_picked():
    p = _pred()
    p.layer_budget = _ident(2)
    with pytest.raises(PredictorMismatch, match="'layer_budget_max_batch' is missing"):
        p.schedule_range(3)
    p.layer_budget_max_batch = torch.tensor([3.0])
    assert (p.schedule_range(3), p.schedule_range(4)) == (0, 1)


# ---- the core runs the table of the step's range -----------------------------------------------
def _ordered_routing(T):
    """T rows (a multiple of 3), row t routes experts 2(t%3), 2(t%3)+1 with weight 0.5 each:
    every expert has T/3 tokens, so D_u = T/3 * 0.25 * n_u^2 orders the experts by n_u."""
    ids = torch.tensor([[2 * (t % 3), 2 * (t % 3) + 1] for t in range(T)])  # [T, 2]
    w = torch.full((T, K), 0.5)
    logits = torch.zeros(T, E).scatter(1, ids, 1.0) - 0.1 * torch.arange(E)  # [T, E]
    return logits, ids, w


@pytest.mark.parametrize("T, r", [(3, 0), (6, 1), (9, 2), (12, 2)])
def test_core_keeps_the_experts_of_its_ranges_table(T, r):
    # predicted norms n_u = 6, 5, ..., 1 (zero weights, bias = log n): expert 0 is the most costly
    # to remove. Range r (bounds 3, 6: rows 1-3, 4-6, 7+) runs M_l = r + 1 at batch budget 2, so
    # the kept set is experts {0, .., r} (hand-computed from D), whatever the batch budget says.
    table = _ident(3)
    table[:, 0, 2] = torch.tensor([1.0, 2.0, 3.0])
    p = _pred(layer_budget=table, layer_budget_max_batch=torch.tensor([3.0, 6.0]))
    p.weight.zero_()
    p.bias[0] = torch.log(torch.arange(E, 0, -1, dtype=torch.float32))
    logits, ids, w = _ordered_routing(T)
    sel = select_experts(logits, ids, w, torch.randn(T, H), torch.full((T,), 2), 0,
                         SelectionConfig(policy="base_sched"), p)
    assert set(sel.ids[sel.ids >= 0].tolist()) == set(range(r + 1))
    assert int(sel.stats.num_kept) == r + 1 and int(sel.stats.num_union) == E
    plus = select_experts(logits, ids, w, torch.randn(T, H), torch.full((T,), r + 1), 0,
                          SelectionConfig(policy="base_plus"), p)
    assert torch.equal(sel.ids, plus.ids) and torch.equal(sel.weights, plus.weights)


def test_padded_rows_count_toward_the_range():
    # the pick uses the rows the selection sees (under CUDA graphs: the captured batch size)
    table = _ident(2)
    table[1, 0, 3] = 5
    p = _pred(layer_budget=table, layer_budget_max_batch=torch.tensor([4.0]))
    logits, ids, w = make_routing(8, E, K, seed=0)
    b = torch.tensor([3, 3, -1, -1, -1, -1, -1, -1])  # 2 real rows in an 8-row graph
    sel = select_experts(logits, ids, w, torch.randn(8, H), b, 0,
                         SelectionConfig(policy="base_sched"), p)
    assert len(set(ids[:2].flatten().tolist())) == 4  # range 0 (the 2 real rows) would keep 3
    assert int(sel.stats.num_kept) == 4
