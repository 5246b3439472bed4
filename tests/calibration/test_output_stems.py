"""Output stems of the calibration CLIs: a dot inside a stem is kept ("share0.05" must not become
"share0" and overwrite another run's files); a known output suffix is replaced."""

from __future__ import annotations

import json

from base_sglang.calibration.report import stem_path, write_outputs


def test_stem_path_keeps_dots_and_replaces_known_suffixes(tmp_path):
    assert stem_path(tmp_path / "q_share0.05", ".json") == tmp_path / "q_share0.05.json"
    assert stem_path(tmp_path / "q.v2", ".csv") == tmp_path / "q.v2.csv"
    assert stem_path(tmp_path / "q", ".png") == tmp_path / "q.png"
    assert stem_path(tmp_path / "q.json", ".csv") == tmp_path / "q.csv"
    assert stem_path(tmp_path / "p.safetensors", ".json") == tmp_path / "p.json"


def test_dotted_stems_do_not_overwrite_each_other(tmp_path):
    row = dict(setting="dense", policy="dense", value="-", experts=8.0, union=8.0, ppl=5.0,
               dppl_pct=0.0, agree=1.0, kl=0.0, energy=1.0)
    write_outputs(tmp_path / "run0", [row], {"tau": 0}, {})
    paths = write_outputs(tmp_path / "run0.05", [dict(row, ppl=6.0)], {"tau": 0.05}, {})
    assert paths[0] == tmp_path / "run0.05.json"
    assert json.loads((tmp_path / "run0.json").read_text())["meta"] == {"tau": 0}
    assert json.loads((tmp_path / "run0.05.json").read_text())["rows"][0]["ppl"] == 6.0
