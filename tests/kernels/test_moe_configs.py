"""kernels/moe_configs.py: the shipped tuned table parses, and default_config looks rows up as the
module says (largest tuned T <= T, pair-major only at its own T, dense vs budget rows)."""

from __future__ import annotations

import json

import pytest

from base_sglang.kernels.fused_moe import MoeConfig, default_config, pair_major_wins
from base_sglang.kernels.moe_configs import (
    CONFIG_DIR,
    gpu_file,
    load_table,
    route_split_min_t,
    shape_key,
    tuned_row,
)
from base_sglang.kernels.moe_gemm import GemmConfig

QWEN3 = dict(num_experts=128, hidden=2048, inter=768, top_k=8)
KEY = shape_key(**QWEN3)


def _row(pair_major=False, block_m=16, up_n=32):
    return {"block_m": block_m, "pair_major": pair_major,
            "up": {"block_n": up_n, "block_k": 64, "num_warps": 4, "num_stages": 5, "n_fast": False},
            "down": {"block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 4, "n_fast": True}}


def test_shipped_table_parses_into_configs():
    files = sorted(CONFIG_DIR.glob("*.json"))
    assert gpu_file("NVIDIA H200") in files
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["provenance"]["gpu"] == f.stem.replace("_", " ")
        table = load_table(str(f))
        assert KEY in table
        for kinds in table.values():
            assert set(kinds) <= {"dense", "budget"}
            for rows in kinds.values():
                for t, row in rows.items():
                    cfg = MoeConfig.from_dict(row)
                    assert t >= 1 and cfg.block_m in (16, 32, 64) and cfg.up.block_n >= 16


def test_a_borrowed_table_reads_the_named_gpus_rows(tmp_path, monkeypatch):
    """"same_as": the named GPU's rows as they are; a chain of borrowing is refused, not followed."""
    from base_sglang.kernels import moe_configs

    h100 = load_table(str(gpu_file("NVIDIA H100 80GB HBM3")))
    assert h100 == load_table(str(gpu_file("NVIDIA H200"))) and KEY in h100
    assert json.loads(gpu_file("NVIDIA H100 80GB HBM3").read_text())["same_as"] == "NVIDIA H200"
    monkeypatch.setattr(moe_configs, "CONFIG_DIR", tmp_path)
    (tmp_path / "GPU_A.json").write_text(json.dumps({"provenance": {"gpu": "GPU A"}, "same_as": "GPU B"}))
    (tmp_path / "GPU_B.json").write_text(json.dumps({"provenance": {"gpu": "GPU B"}, "same_as": "GPU C"}))
    with pytest.raises(ValueError, match="GPU_B.json, which borrows its rows too"):
        load_table(str(tmp_path / "GPU_A.json"))
    (tmp_path / "GPU_B.json").write_text(json.dumps({"provenance": {"gpu": "GPU B"},
                                                     "shapes": {KEY: {"dense": {"8": _row()}}}}))
    load_table.cache_clear()
    assert load_table(str(tmp_path / "GPU_A.json")) == {KEY: {"dense": {8: _row()}}}
    load_table.cache_clear()


def test_route_split_min_t_is_the_gpus_own_and_moves_the_rule(tmp_path, monkeypatch):
    """A GPU file's route_split_min_t (measured on that GPU) moves route_mode's fold/split boundary;
    it is not borrowed through same_as, and a bad value is refused naming the field."""
    from base_sglang.kernels import moe_configs
    from base_sglang.kernels.select_experts import SPLIT_MAX_T, SPLIT_MIN_T, route_mode

    monkeypatch.delenv("BASE_ROUTE", raising=False)
    assert route_split_min_t("NVIDIA H100 80GB HBM3") == 8 and route_split_min_t("NVIDIA H200") == 8
    assert route_split_min_t(None) is None
    assert route_split_min_t("No Such GPU") is None
    ts = (1, 7, 8, 16, 31, 32, SPLIT_MAX_T, SPLIT_MAX_T + 1)
    for gpu in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        assert [route_mode(t, 128, gpu) for t in ts] == \
            ["fold", "fold", "split", "split", "split", "split", "split", "unfold"]
    for gpu in ("No Such GPU", None):  # no field: SPLIT_MIN_T
        assert [route_mode(t, 128, gpu) for t in ts] == \
            ["fold"] * 5 + ["split", "split", "unfold"] and SPLIT_MIN_T == 32
    monkeypatch.setenv("BASE_ROUTE", "auto")  # auto = the rule
    assert route_mode(16, 128, "NVIDIA H200") == "split" and route_mode(16, 128) == "fold"
    monkeypatch.setenv("BASE_ROUTE", "fold")  # an override beats the GPU's field
    assert route_mode(16, 128, "NVIDIA H100 80GB HBM3") == "fold"

    monkeypatch.setattr(moe_configs, "CONFIG_DIR", tmp_path)
    route_split_min_t.cache_clear()
    try:
        (tmp_path / "GPU_B.json").write_text(json.dumps({"provenance": {"gpu": "GPU B"},
                                                         "route_split_min_t": 4, "shapes": {}}))
        (tmp_path / "GPU_A.json").write_text(json.dumps({"provenance": {"gpu": "GPU A"}, "same_as": "GPU B"}))
        assert route_split_min_t("GPU B") == 4 and route_split_min_t("GPU A") is None
        for bad in (0, -3, 2.5, "8", True):
            (tmp_path / "GPU_C.json").write_text(json.dumps({"provenance": {"gpu": "GPU C"},
                                                             "route_split_min_t": bad, "shapes": {}}))
            route_split_min_t.cache_clear()
            with pytest.raises(ValueError, match="GPU_C.json: route_split_min_t must be an integer >= 1"):
                route_split_min_t("GPU C")
    finally:
        route_split_min_t.cache_clear()


def test_lookup_rules():
    table = {KEY: {"dense": {1: _row(True), 2: _row(True), 8: _row(up_n=64), 32: _row(up_n=16)},
                   "budget": {8: _row(block_m=64)}}}
    assert tuned_row(table, KEY, 1, False)["pair_major"]
    assert tuned_row(table, KEY, 2, False)["pair_major"]
    assert tuned_row(table, KEY, 4, False)["up"]["block_n"] == 64  # pair-major not extrapolated
    assert tuned_row(table, KEY, 31, False)["up"]["block_n"] == 64  # largest tuned T <= 31: 8
    assert tuned_row(table, KEY, 32, False)["up"]["block_n"] == 16
    assert tuned_row(table, KEY, 33, False) is None  # above the largest tuned T
    assert tuned_row(table, KEY, 8, True)["block_m"] == 64
    assert tuned_row(table, KEY, 2, True) is None  # below the smallest budget row
    assert tuned_row(table, shape_key(64, 2048, 1024, 8), 8, False) is None
    assert load_table("/nonexistent/NVIDIA_X.json") == {}


def test_default_config_uses_the_h200_rows():
    table = load_table(str(gpu_file("NVIDIA H200")))
    for budgeted, kind in ((False, "dense"), (True, "budget")):
        for t, row in table[KEY][kind].items():
            got = default_config(t, QWEN3["num_experts"], QWEN3["top_k"],
                                 16 if budgeted else None, hidden=2048, inter=768, gpu="NVIDIA H200")
            assert got == MoeConfig.from_dict(row)
    # another GPU, or the shape unknown: the heuristic
    other = default_config(64, 128, 8, 16, hidden=2048, inter=768, gpu="NVIDIA A100")
    assert other == default_config(64, 128, 8, 16)
    assert other.block_m == 32 and not other.pair_major


def test_heuristic():
    assert pair_major_wins(1, 8, 2) and pair_major_wins(2, 64, 8) and not pair_major_wins(2, 8, 2)
    assert not pair_major_wins(3, 128, 8)
    assert default_config(1, 128, 8).pair_major and default_config(2, 128, 8).pair_major
    assert not default_config(2, 8, 2, inter=14336).pair_major
    assert default_config(16, 8, 2, inter=14336).up == GemmConfig(32, 256, 4, 3)
    assert default_config(8, 128, 8).block_m == 16
    assert default_config(64, 128, 8, 8).block_m == 64  # 512 pairs over 8 experts
