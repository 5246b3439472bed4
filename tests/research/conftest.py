"""Shared fixture of the research perplexity tests (sketch_ppl, rel_score): a tiny random Qwen3-MoE
checkpoint, calibrated, loaded once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "calibration"))
import tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory):
    """(checkpoint dir, predictor path, data path) of the tiny calibrated checkpoint."""
    from base_sglang.calibration.__main__ import main as calibrate_main

    root = tmp_path_factory.mktemp("research_ppl")
    docs = tiny.synthetic_docs(48)
    data = tiny.write_text(root / "docs.txt", docs)
    ckpt = tiny.make_checkpoint("qwen3_moe", root / "ckpt", docs)
    pred = root / "p.safetensors"
    assert calibrate_main(["--model", str(ckpt), "--data", str(data), "--out", str(pred),
                           "--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4",
                           "--stat-batch", "4", "--quiet"]) == 0
    return ckpt, pred, data


@pytest.fixture(scope="session")
def setup(tiny_files):
    """(model, tokenizer, MoE blocks, predictor, data path) of the tiny calibrated checkpoint."""
    from base_sglang.core import Predictor
    from base_sglang.hf import find_moe_blocks, load_model

    ckpt, pred, data = tiny_files
    model, tok = load_model(str(ckpt), "cpu", "float32")
    return model, tok, find_moe_blocks(model, require=True), Predictor.load(pred), str(data)
