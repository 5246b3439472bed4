"""layer_schedule with one table per batch-size range: bounds, measuring several batch sizes, and
merging curves stored by earlier single-batch runs into one multi-range predictor file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from base_sglang.calibration.layer_schedule import (
    check_ranges,
    geometric_bounds,
    main,
    schedule_table,
)
from base_sglang.core import Predictor


def test_geometric_bounds_and_their_checks():
    assert geometric_bounds([8, 16, 64]) == [11, 32]
    assert geometric_bounds([16]) == []
    assert check_ranges([8, 16, 64], None) == [11, 32]
    assert check_ranges([8, 16, 64], [8, 63]) == [8, 63]
    for sizes, bounds, match in [([16, 8], None, "batch-sizes: must be distinct and ascending"),
                                 ([8, 8], None, "batch-sizes: must be distinct"),
                                 ([0, 8], None, "batch-sizes: must be positive"),
                                 ([8, 16], [4], r"range-bounds: bound 4 of range 0 must lie in \[8, 16\)"),
                                 ([8, 16], [16], "must lie in"),
                                 ([8, 16], [10, 20], "range-bounds: needs 1 bounds")]:
        with pytest.raises(ValueError, match=match):
            check_ranges(sizes, bounds)


@pytest.fixture(scope="module")
def calibrated(tiny_ckpt, tiny_data, tmp_path_factory):
    from base_sglang.calibration.calibrate import main as calibrate_main

    tmp = tmp_path_factory.mktemp("ranges")
    model = str(tiny_ckpt("qwen3_moe"))
    pred = tmp / "p.safetensors"
    assert calibrate_main(["--model", model, "--data", str(tiny_data), "--out", str(pred),
                           "--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4",
                           "--stat-batch", "4", "--quiet"]) == 0
    return model, pred, tmp


def _fake_curves(path, meta_src, batch_size, hot, layers):
    """A stored single-batch schedule file (as the q3 files hold them) with made-up curves: layer
    `hot` loses much more than the others, so the schedule gives it more experts."""
    curves = {layer: [(1, 5.0), (2, 4.0)] if layer == hot else [(1, 0.1), (2, 0.05)]
              for layer in layers}
    rec = json.loads(meta_src.read_text())
    rec["meta"]["batch_size"] = batch_size
    rec["curves"] = {str(k): [list(x) for x in v] for k, v in curves.items()}
    path.write_text(json.dumps(rec))
    return curves


def test_measured_ranges_and_merged_stored_curves(calibrated, tiny_data):
    model, pred, tmp = calibrated
    args = ["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--prefix", "6",
            "--steps", "3", "--budgets", "1", "2", "--up-to", "3"]
    stem = tmp / "two"
    assert main([*args, "--out", str(stem), "--batch-sizes", "2,4", "--num-batches", "1"]) == 0
    rec = json.loads(stem.with_suffix(".json").read_text())
    p = Predictor.load(stem.with_suffix(".safetensors"))
    E, L, layers = p.meta.num_experts, len(p.meta.moe_layers), p.meta.moe_layers
    assert p.layer_budget.shape == (2, L, E + 1) and p.schedule_bounds == (2,)  # isqrt(2 * 4)
    assert rec["meta"]["batch_sizes"] == [2, 4] and rec["meta"]["range_max_batch"] == [2]
    assert [(r["batch_size"], r["min_batch"], r["max_batch"]) for r in rec["ranges"]] == \
        [(2, 1, 2), (4, 3, None)]
    for r, entry in enumerate(rec["ranges"]):
        curves = {int(k): v for k, v in entry["curves"].items()}
        want = schedule_table(curves, layers, E, 1, 3)  # [L, E+1]
        assert np.array_equal(p.layer_budget[r].numpy(), want)
        assert entry["table"] == {str(layer): [int(x) for x in want[j]] for j, layer in
                                  enumerate(layers)}
    assert p.meta.calibration["layer_schedule"]["ranges"][1]["batch_size"] == 4

    # one single-batch run, then two stored files with other curves merged into three ranges
    one = tmp / "one"
    assert main([*args, "--out", str(one), "--batch-size", "2", "--num-batches", "1"]) == 0
    assert Predictor.load(one.with_suffix(".safetensors")).layer_budget.shape == (L, E + 1)
    c8 = _fake_curves(tmp / "b8.json", one.with_suffix(".json"), 8, layers[0], layers)
    c32 = _fake_curves(tmp / "b32.json", one.with_suffix(".json"), 32, layers[1], layers)
    merged = tmp / "merged"
    files = f"{tmp / 'b32.json'},{one.with_suffix('.json')},{tmp / 'b8.json'}"  # any order
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(merged), "--curves", files, "--up-to", "3"]) == 0
    q = Predictor.load(merged.with_suffix(".safetensors"))
    assert q.layer_budget.shape == (3, L, E + 1) and q.schedule_bounds == (4, 16)  # isqrt 16, 256
    mrec = json.loads(merged.with_suffix(".json").read_text())
    assert [r["batch_size"] for r in mrec["ranges"]] == [2, 8, 32]
    assert mrec["ranges"][2]["curves_from"] == str(tmp / "b32.json")
    for r, curves in ((1, c8), (2, c32)):
        assert np.array_equal(q.layer_budget[r].numpy(), schedule_table(curves, layers, E, 1, 3))
    # hand-computed (E = 8, two layers, M = 2 and 3 scheduled): the hot layer takes 3 and 5
    assert (E, L) == (8, 2)
    assert q.layer_budget[1, :, 2].tolist() == [3, 1] and q.layer_budget[1, :, 3].tolist() == [5, 1]
    assert q.layer_budget[2, :, 2].tolist() == [1, 3] and q.layer_budget[2, :, 3].tolist() == [1, 5]
    assert q.layer_budget[:, :, 4].tolist() == [[4, 4]] * 3  # above --up-to: uniform
    # B = 4 rows is range 0 (<= 4), 5..16 range 1, 17+ range 2
    assert [q.schedule_range(b) for b in (4, 5, 16, 17)] == [0, 1, 1, 2]

    # a multi-range file is itself a curves source; explicit bounds; bad combinations
    again = tmp / "again"
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(again), "--curves", str(merged.with_suffix(".json")), "--up-to", "3",
                 "--range-bounds", "7,31"]) == 0
    a = Predictor.load(again.with_suffix(".safetensors"))
    assert torch_equal(a.layer_budget, q.layer_budget) and a.schedule_bounds == (7, 31)
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(again), "--curves", files, "--range-bounds", "9,31"]) == 2  # 9 not in [2, 8)
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(again), "--curves", files, "--batch-sizes", "2,8"]) == 2
    assert main(["--model", model, "--predictor", str(pred), "--data", str(tiny_data), "--out",
                 str(again), "--curves", f"{tmp / 'b8.json'},{tmp / 'b8.json'}"]) == 2  # same B
    with pytest.raises(SystemExit):
        main([*args, "--out", str(again), "--batch-sizes", "2,x"])


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))
