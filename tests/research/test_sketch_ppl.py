"""research/sketch_ppl.py on a tiny random Qwen3-MoE: the fit, the norm swap and its restoration."""

from __future__ import annotations

import pytest
import torch

from base_sglang.calibration.config import CalibrationConfig
from research.sketch_ppl import (
    eval_batches,
    evaluate,
    fit_sketch,
    predict_log_norms,
    replace_norms,
    sketch_norm_fn,
    table_rows,
)

CFG = CalibrationConfig(num_seqs=16, seq_len=24, heldout_every=4)


def test_sketch_fit_and_prediction(setup):
    model, tok, blocks, _, data = setup
    fits, metrics = fit_sketch(model, blocks, tok, data, 4, CFG, B=4)
    assert set(fits) == set(blocks)
    for j, f in fits.items():
        E, twoI, H = blocks[j].experts.gate_up_proj.shape
        assert f.theta.shape == (E, H + 2) and f.A.shape == (E, twoI, 4) and f.B.shape == (E, 4, H)
        assert -10 < metrics[str(j)]["r2"] <= 1
    ex = blocks[min(blocks)].experts
    z, ids = torch.randn(5, ex.gate_up_proj.shape[2]), torch.randint(0, 8, (5, 2))
    y = predict_log_norms(fits[min(blocks)], z, ids, ex.down_proj.detach(), ex.act_fn)
    assert y.shape == (5, 2) and torch.isfinite(y).all()


def test_true_norm_swap_reproduces_oracle_plus_and_is_restored(setup):
    from base_sglang.hf import patch as hp

    model, tok, blocks, predictor, data = setup
    original = hp.expert_output_norms
    fits, _ = fit_sketch(model, blocks, tok, data, 4, CFG, B=4)
    calls = []

    def true_norms(j, x, ids, gate_up, down, act):
        calls.append(j)
        assert gate_up is blocks[j].experts.gate_up_proj  # the layer found by identity
        return original(x, ids, gate_up, down, act)

    batches = eval_batches(tok, data, 4, 1, 8, 4)
    rows = evaluate(model, predictor, batches, 8, 4, [2, 3], blocks,
                    {"true": true_norms, "sketch": sketch_norm_fn(fits, blocks)}, quiet=True)
    assert hp.expert_output_norms is original
    by = {(r["policy"], r["value"]): r for r in rows}
    assert set(calls) == set(blocks)
    for m in (2, 3):
        assert by[("true", m)]["ppl"] == by[("oracle_plus", m)]["ppl"]  # exactly
        assert by[("true", m)]["experts"] == by[("oracle_plus", m)]["experts"]
        assert by[("sketch", m)]["experts"] <= m + 1e-9
    t = {(r["policy"], r["M"]): r for r in table_rows(rows)}
    assert t[("oracle_plus", 2)]["ratio_to_oracle_plus"] in (1.0, None)
    if t[("base_plus", 2)]["dppl_pct"] != t[("oracle_plus", 2)]["dppl_pct"]:
        assert t[("true", 2)]["gap_closed"] == pytest.approx(1.0)
        assert t[("base_plus", 2)]["gap_closed"] == pytest.approx(0.0)


def test_replace_norms_restores_on_error(setup):
    from base_sglang.hf import patch as hp

    _, _, blocks, _, _ = setup
    original = hp.expert_output_norms
    with pytest.raises(RuntimeError), replace_norms(blocks, lambda *a: None):
        assert hp.expert_output_norms is not original
        with pytest.raises(KeyError):  # a tensor of no MoE block
            hp.expert_output_norms(torch.zeros(1, 4), torch.zeros(1, 2), torch.zeros(8, 4, 4),
                                   torch.zeros(8, 4, 2))
        raise RuntimeError
    assert hp.expert_output_norms is original
