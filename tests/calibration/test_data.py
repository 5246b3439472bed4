"""Document reading, the deterministic calibration/evaluation split, and windows."""

from __future__ import annotations

import json

import pytest

from base_sglang.calibration.data import (
    distinct_batches,
    read_documents,
    split_documents,
    windows,
)


def test_txt_and_jsonl_documents(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("first doc\nline two\n<|endoftext|>\nsecond\n<<<pydoc>>>\nthird one\n")
    assert read_documents(txt) == ["first doc\nline two", "second", "third one"]
    jl = tmp_path / "b.jsonl"
    jl.write_text(json.dumps({"text": "x y"}) + "\n\n" + json.dumps({"text": "z"}) + "\n")
    assert read_documents(jl) == ["x y", "z"]
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"body": "no text field"}\n')
    with pytest.raises(ValueError, match="text"):
        read_documents(bad)
    gz = tmp_path / "a.txt.gz"
    gz.write_text("x")
    with pytest.raises(ValueError, match=r"\.txt or \.jsonl"):
        read_documents(gz)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_documents(tmp_path / "missing.txt")


def test_split_is_deterministic_disjoint_and_order_free():
    docs = [f"document number {i} " * 3 for i in range(200)]
    cal, ev = split_documents(docs, "calib"), split_documents(docs, "eval")
    assert set(cal).isdisjoint(ev) and len(cal) + len(ev) == len(docs)
    assert 60 < len(ev) < 140  # about half
    assert set(split_documents(docs[::-1], "eval")) == set(ev)  # content-addressed, not positional
    assert split_documents(docs, "eval", eval_percent=0) == []
    with pytest.raises(ValueError, match="split"):
        split_documents(docs, "train")


def test_tune_and_report_partition_the_eval_half():
    docs = [f"document number {i} " * 3 for i in range(400)]
    ev, tune, rep = (split_documents(docs, s) for s in ("eval", "tune", "report"))
    assert set(tune).isdisjoint(rep) and set(tune) | set(rep) == set(ev)
    assert 0.15 * len(ev) < len(tune) < 0.45 * len(ev)  # about 30 %
    assert set(split_documents(docs[::-1], "tune")) == set(tune)
    assert split_documents(docs, "tune", tune_percent=0) == [] and split_documents(
        docs, "report", tune_percent=100) == []
    with pytest.raises(ValueError, match="tune_percent"):
        split_documents(docs, "tune", tune_percent=101)


def test_windows_round_robin_and_distinct_batches():
    doc_ids = [list(range(100 * d, 100 * d + n)) for d, n in enumerate([30, 10, 25, 4])]
    w = windows(doc_ids, 10)
    assert [d for d, _ in w] == [0, 1, 2, 0, 2, 0]  # doc 3 is too short
    assert all(len(x) == 10 for _, x in w) and w[3][1] == list(range(10, 20))
    batches = distinct_batches(w, 3)
    assert len(batches) == 1 and sorted(d for d, _ in batches[0]) == [0, 1, 2]
    assert distinct_batches(w, 4) == []  # only three documents qualify
