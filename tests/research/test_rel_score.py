"""research/rel_score.py: per-token 1/||x_mid|| weighting of BASE's score, its swaps and their undoing."""

from __future__ import annotations

import pytest
import torch

from base_sglang.core import SelectionConfig, select_experts
from research.rel_score import (
    XMidCapture,
    eval_batches,
    evaluate,
    fit_ridge,
    parse_policy,
    predict_ridge,
    rel_log_norms,
    rel_norms,
    replace_predicted_norms,
    replace_true_norms,
    table_rows,
)


def _routing(T=12, E=16, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g) * 2
    w, ids = torch.softmax(logits, -1).topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    norms = torch.rand(T, K, generator=g) * 3 + 0.1
    return logits, ids, w, norms


def _oracle(logits, ids, w, norms, m):
    cfg = SelectionConfig(policy="oracle", renorm="partial")
    budget = torch.full((ids.shape[0],), m, dtype=torch.long)
    return select_experts(logits, ids, w, None, budget, 0, cfg, routed_norms=norms)


def test_equal_xmid_gives_the_unweighted_picks():
    logits, ids, w, norms = _routing()
    for c in (1.0, 4.0, 3.7):  # one ||x_mid|| for every token
        log_x = torch.full((ids.shape[0],), float(torch.log(torch.tensor(c))))
        for m in (3, 6, 9):
            a, b = _oracle(logits, ids, w, norms, m), _oracle(logits, ids, w, rel_norms(norms, log_x, 1.0), m)
            assert torch.equal(a.ids, b.ids) and torch.equal(a.weights, b.weights)
    yhat = torch.randn(5, 3)
    assert torch.equal(rel_log_norms(yhat, torch.randn(5), 0.0), yhat)
    assert torch.allclose(rel_log_norms(yhat, torch.full((5,), 2.0), 0.5), yhat - 1.0)
    assert torch.allclose(rel_norms(torch.ones(2, 3), torch.log(torch.tensor([2.0, 4.0])), 1.0),
                          torch.tensor([[0.5] * 3, [0.25] * 3]))


def test_unequal_xmid_reweights_the_batch_score_only():
    """A token with a huge ||x_mid|| stops counting in D_u; every token's ids are still the first K
    of its own preference order inside the kept set (the backfill order is unchanged)."""
    from base_sglang.core.selection import preference_order

    logits, ids, w, norms = _routing(seed=1)
    T, E, K = ids.shape[0], logits.shape[1], ids.shape[1]
    log_x = torch.zeros(T)
    log_x[0] = 30.0  # token 0 counts ~nothing
    sel = _oracle(logits, ids, w, rel_norms(norms, log_x, 1.0), 5)
    ref = _oracle(logits[1:], ids[1:], w[1:], norms[1:], 5)  # the batch without token 0
    kept = torch.zeros(E, dtype=torch.bool)
    kept[sel.ids[sel.ids >= 0]] = True
    kept_ref = torch.zeros(E, dtype=torch.bool)
    kept_ref[ref.ids[ref.ids >= 0]] = True
    assert torch.equal(kept, kept_ref)  # token 0 backfills within the same kept set
    assert torch.equal(sel.ids[1:], ref.ids)
    routed = torch.zeros(T, E, dtype=torch.bool).scatter_(1, ids, True)
    pref, fresh = preference_order(logits, ids, torch.ones_like(ids, dtype=torch.bool), routed)
    for t in range(T):
        order = [int(e) for e, f in zip(pref[t], fresh[t]) if f and kept[e]][:K]
        assert [int(e) for e in sel.ids[t] if e >= 0] == order


def test_parse_policy():
    assert parse_policy("base_rel") == ("base_rel", 1.0)
    assert parse_policy("oracle_rel_0.5") == ("oracle_rel", 0.5)
    assert parse_policy("base_relhat_0.5") == ("base_relhat", 0.5)
    with pytest.raises(ValueError):
        parse_policy("base_plus")


def test_ridge_recovers_a_linear_log_norm():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(500, 6, generator=g)
    theta = torch.tensor([0.3, -0.2, 0.0, 0.1, 0.5, -0.4, 1.5])
    y = predict_ridge(theta, z)
    assert torch.allclose(fit_ridge(z, y, 0.0), theta, atol=1e-4)


def test_gamma0_reproduces_both_plus_policies_and_swaps_are_undone(setup):
    from base_sglang.hf import patch as hp

    model, tok, blocks, predictor, data = setup
    original = hp.expert_output_norms
    batches = eval_batches(tok, data, 4, 1, 8, 4)
    labels = ["oracle_rel_0", "base_rel_0", "oracle_rel", "base_rel"]
    rows, lps = evaluate(model, predictor, batches, 8, 4, [2, 3], blocks, labels, quiet=True)
    assert hp.expert_output_norms is original
    assert "predict_log_norm" not in vars(predictor)
    dec = model.model.layers
    assert all(not dec[j].post_attention_layernorm._forward_pre_hooks for j in blocks)
    by = {(r["policy"], r["value"]): r for r in rows}
    for m in (2, 3):
        for lab, ref in (("oracle_rel_0", "oracle_plus"), ("base_rel_0", "base_plus")):
            assert by[(lab, m)]["ppl"] == by[(ref, m)]["ppl"]  # exactly: the hooks change nothing
            assert torch.equal(lps[f"{lab} M={m}"], lps[f"{ref} M={m}"])
        assert by[("base_rel", m)]["experts"] <= m + 1e-9
    t = {(r["policy"], r["M"]): r for r in table_rows(rows, lps)}
    assert t[("base_rel_0", 2)]["dnll_vs_base_plus"] == 0.0
    if t[("base_plus", 2)]["dppl_pct"] != t[("oracle_plus", 2)]["dppl_pct"]:
        assert t[("oracle_rel_0", 2)]["gap_closed"] == pytest.approx(1.0)


def test_capture_matches_layernorm_input_and_swaps_restore_on_error(setup):
    from base_sglang.hf import patch as hp

    model, _, blocks, predictor, _ = setup
    j = min(blocks)
    cap = XMidCapture(model, sorted(blocks))
    seen = {}
    h = model.model.layers[j].post_attention_layernorm.register_forward_pre_hook(
        lambda mod, args: seen.setdefault("x", args[0].detach().clone()))
    try:
        with torch.no_grad():
            model.model(input_ids=torch.randint(2, 50, (3, 5)), use_cache=False)
    finally:
        h.remove()
        cap.remove()
    assert torch.allclose(cap.norms[j], seen["x"].reshape(15, -1).norm(dim=-1))
    with pytest.raises(RuntimeError):
        cap.log_norm(j, 7)  # a row count that is not the captured forward's

    original, bound = hp.expert_output_norms, predictor.predict_log_norm
    with pytest.raises(RuntimeError, match="boom"), \
            replace_true_norms(blocks, lambda j, z: torch.zeros(z.shape[0]), 1.0), \
            replace_predicted_norms(predictor, lambda j, z: torch.zeros(z.shape[0]), 1.0):
        assert hp.expert_output_norms is not original
        assert "predict_log_norm" in vars(predictor)
        with pytest.raises(KeyError):  # a tensor of no MoE block
            hp.expert_output_norms(torch.zeros(1, 4), torch.zeros(1, 2), torch.zeros(8, 4, 4),
                                   torch.zeros(8, 4, 2))
        raise RuntimeError("boom")
    assert hp.expert_output_norms is original
    assert "predict_log_norm" not in vars(predictor)
    assert predictor.predict_log_norm == bound


def test_report_grid_from_result_rows(tmp_path, capsys):
    from research import rel_score

    rows = [dict(policy="dense", M=None, dppl_pct=0.0),
            dict(policy="base_plus", M=8, dppl_pct=300.0),
            dict(policy="oracle_plus", M=8, dppl_pct=250.0),
            dict(policy="base_rel_0.5", M=8, dppl_pct=290.0, dnll_vs_base_plus=-0.044,
                 dnll_vs_base_plus_se_paired=0.023, dnll_vs_oracle_plus=0.1,
                 dnll_vs_oracle_plus_se_paired=0.02),
            dict(policy="oracle_rel", M=8, dppl_pct=242.7, dnll_vs_oracle_plus=-0.008,
                 dnll_vs_oracle_plus_se_paired=0.025)]
    (tmp_path / "r.json").write_text(__import__("json").dumps({"rows": rows}))
    assert rel_score.main(["--report", str(tmp_path / "r.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| policy | M=8 |"
    assert lines[2:] == ["| base_plus | 300.0 |", "| base_rel_0.5 | 290.0; -0.044 ± 0.023 |",
                         "| oracle_plus | 250.0 |", "| oracle_rel | 242.7; -0.008 ± 0.025 |"]
    assert rel_score.main(["--report", str(tmp_path / "missing.json")]) == 2
