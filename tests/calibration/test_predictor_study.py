"""The predictor-options study on a tiny checkpoint: its linear option is base-calibrate's predictor."""

from __future__ import annotations

import json

import pytest

from base_sglang.calibration.__main__ import main as calibrate_main
from base_sglang.calibration.predictor_study import main, serving_cost

ARGS = ["--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4"]


def test_linear_option_reproduces_base_calibrate(tiny_ckpt, tiny_data, tmp_path):
    ckpt = tiny_ckpt("qwen3_moe")
    pred = tmp_path / "p.safetensors"
    assert calibrate_main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(pred),
                           *ARGS, "--stat-batch", "4", "--quiet"]) == 0
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "s"),
                 "--options", "linear,router,quad16", "--batch-size", "4", *ARGS]) == 0
    res = json.loads((tmp_path / "s.json").read_text())
    from base_sglang.core import Predictor

    fit = Predictor.load(pred).meta.fit_stats
    for layer, opts in res["layers"].items():
        assert opts["linear"]["r2"] == pytest.approx(fit[layer]["r2"], abs=2e-3)
        assert opts["linear"]["spearman_cost"] == pytest.approx(fit[layer]["spearman_cost"], abs=2e-3)
        for o in ("router", "quad16"):
            assert -10 < opts[o]["r2"] <= 1 and 0 <= opts[o]["energy_oracle@2"] <= 1 + 1e-6
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "x"),
                 "--options", "linear,cubic"]) == 2


def test_serving_cost_formulas():
    assert serving_cost("linear", 2048, 128, 8) == {"features": 2048, "macs_per_token": 8 * 2048,
                                                    "bytes_per_layer": 2 * 128 * 2049}
    q = serving_cost("quad32", 2048, 128, 8)
    assert q["features"] == 2048 + 528 and q["macs_per_token"] == 32 * 2048 + 8 * 2576 + 1024


def test_neuron_features_all_neurons_are_the_expert():
    """With S = every neuron the partial output is the expert's output; energy drops cross terms."""
    import torch

    from base_sglang.calibration.neuron_features import neuron_features, select_neurons
    from base_sglang.core.moe_ref import expert_outputs

    g = torch.Generator().manual_seed(0)
    E, I, H, T, K = 4, 6, 8, 10, 2  # noqa: E741
    gu, dn = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    z = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    act = torch.nn.functional.silu
    sel = select_neurons(z, ids, gu, dn, I, act)
    assert sorted(sel[ids[0, 0]].tolist()) == list(range(I))
    logp, logq = neuron_features(z, ids, gu, dn, sel, act)
    full = expert_outputs(z, ids, gu, dn).norm(dim=-1)  # [T, K]
    assert torch.allclose(logp, torch.log(full + 1e-6), atol=1e-4)
    # one neuron: the partial output is h_j d_j, so its norm^2 equals the energy term exactly
    p1, q1 = neuron_features(z, ids, gu, dn, sel[:, :1], act)
    assert torch.allclose(2 * p1, q1, atol=1e-3)
    # the top-1 neuron has the largest mean h_j^2 ||d_j||^2 over the rows routed to its expert
    u = int(ids[0, 0])
    rows = z[(ids == u).any(1)]
    gate, up = (rows @ gu[u].T).chunk(2, -1)
    score = (act(gate) * up).square().mean(0) * dn[u].square().sum(0)
    assert int(sel[u, 0]) == int(score.argmax())
    with pytest.raises(ValueError, match="neurons: r must be"):
        select_neurons(z, ids, gu, dn, I + 1, act)


def test_neuron_options_run_and_full_subset_is_exact(tiny_ckpt, tiny_data, tmp_path):
    ckpt = tiny_ckpt("qwen3_moe")  # expert intermediate size 16
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "n"),
                 "--options", "linear,neuron4,nenergy4_only,neuron16_only", "--batch-size", "4",
                 *ARGS]) == 0
    res = json.loads((tmp_path / "n.json").read_text())
    for opts in res["layers"].values():
        assert opts["neuron16_only"]["r2"] == pytest.approx(1.0, abs=1e-3)  # S = all: y = log||P||
        assert opts["neuron16_only"]["energy_pred@2"] == pytest.approx(opts["linear"]["energy_oracle@2"],
                                                                      abs=1e-4)
        assert -10 < opts["neuron4"]["r2"] <= 1
    s = res["summary"]
    assert s["linear"]["gap_closed@2"] == 0 and s["neuron16_only"]["gap_closed@2"] == pytest.approx(1, abs=1e-3)
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "x"),
                 "--options", "neuron32", *ARGS]) == 2


def test_neuron_serving_cost():
    c = serving_cost("neuron16", 2048, 128, 8, 768)
    per = 2 * 16 * 2048 + 2048 * 16
    assert c["macs_per_token"] == 8 * (per + 2049) and c["bytes_per_layer"] == 2 * 128 * (per + 2050)
    assert c["expert_bytes_fraction"] == pytest.approx(16 / 768, abs=1e-5)
    o = serving_cost("nenergy8_only", 256, 64, 8, 64)
    assert o["features"] == 1 and o["bytes_per_layer"] == 2 * 64 * (2 * 8 * 256 + 8 + 2)
    with pytest.raises(ValueError, match="intermediate size"):
        serving_cost("neuron4", 256, 64, 8)


def test_neuron_rule_var_picks_the_most_variable_energy():
    import torch

    from base_sglang.calibration.neuron_features import select_neurons

    g = torch.Generator().manual_seed(1)
    E, I, H, T = 2, 5, 6, 40  # noqa: E741
    gu, dn = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    z = torch.randn(T, H, generator=g)
    ids = torch.zeros(T, 1, dtype=torch.long)  # every row routed to expert 0
    act = torch.nn.functional.silu
    gate, up = (z @ gu[0].T).chunk(2, -1)
    c = (act(gate) * up).square() * dn[0].square().sum(0)  # [T, I]
    assert select_neurons(z, ids, gu, dn, I, act, "var")[0].tolist() == c.var(0, correction=0).argsort(
        descending=True).tolist()
    assert select_neurons(z, ids, gu, dn, 2, act)[0].tolist() == c.mean(0).topk(2).indices.tolist()
    with pytest.raises(ValueError, match="neuron_rule"):
        select_neurons(z, ids, gu, dn, 2, act, "random")


def test_sample_weights_of_the_ridge():
    # equal weights are the unweighted fit; a zero weight removes its row from the fit
    import torch

    from base_sglang.calibration.predictor_study import ridge

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(40, 3, generator=g)  # [T, F]
    e = torch.randint(0, 2, (40,), generator=g)  # one slot per token: rows are tokens
    y = torch.randn(40, generator=g)
    tok = torch.arange(40)
    plain = ridge(feats, y, e, tok, 2, 0.1)
    torch.testing.assert_close(ridge(feats, y, e, tok, 2, 0.1, sample_w=torch.full((40,), 3.0)),
                               plain, rtol=1e-5, atol=1e-6)
    keep = torch.arange(40) != 7
    assert not torch.allclose(ridge(feats, y, e, tok, 2, 0.1, sample_w=keep.float()), plain)
    # lambda follows the weights' scale (mean 1 per expert), so compare the unregularised fits
    torch.testing.assert_close(ridge(feats, y, e, tok, 2, 0.0, sample_w=keep.float()),
                               ridge(feats[keep], y[keep], e[keep], torch.arange(39), 2, 0.0),
                               rtol=1e-4, atol=1e-5)


def test_mlp_option_fits_a_nonlinear_target_better_than_linear():
    """y_u = a_u.z + c_u |v.z| (a shared nonlinear direction): mlp8 beats the ridge on held-out rows."""
    import torch

    from base_sglang.calibration.mlp_predictor import MLPConfig, fit_mlp, mlp_features
    from base_sglang.calibration.predictor_study import ridge

    g = torch.Generator().manual_seed(0)
    T, H, E, K, win = 1200, 12, 4, 2, 20
    z = torch.randn(T + 400, H, generator=g) * 3 + 1  # raw scale and offset: the fit standardises
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T + 400)])  # [T', K]
    a, c, v = torch.randn(E, H, generator=g) * 0.1, torch.randn(E, generator=g), torch.randn(H, generator=g)
    y = (z @ a.T).gather(1, ids) + c[ids] * (z @ v / H ** 0.5).abs()[:, None]  # [T', K]
    y = y + 0.05 * torch.randn(y.shape, generator=g)
    tok = torch.arange(T).repeat_interleave(K)

    def ridge_fit(n):
        m = tok < n
        return ridge(z[:n], y[:T].reshape(-1)[m], ids[:T].reshape(-1)[m], tok[m], E, 1e-3)

    f = fit_mlp(z[:T], z[:T], ids[:T], y[:T], E, 8, 1e-3, ridge_fit, MLPConfig(max_steps=300, lr=3e-2), win)
    assert f.theta.shape == (E, H + 8 + 1) and f.proj.shape == (8, H) and f.info["best_step"] > 0

    def held_mse(theta, feats):  # theta [E, F+1], feats [400, F]
        th = theta[ids[T:]]  # [400, K, F+1]
        pred = torch.einsum("tf,tkf->tk", feats, th[..., :-1]) + th[..., -1]
        return float((pred - y[T:]).square().mean())

    lin = held_mse(ridge_fit(T), z[T:])
    mlp = held_mse(f.theta, mlp_features(z[T:], z[T:], f.proj, f.shift))
    assert mlp < 0.5 * lin, (mlp, lin)
    assert f.info["val_mse"] < f.info["val_mse_step0"]  # step 0 is the ridge fit of the train slice


def test_mlp_options_run_in_the_study_and_bad_names_fail(tiny_ckpt, tiny_data, tmp_path, capsys):
    ckpt = tiny_ckpt("qwen3_moe")
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "m"),
                 "--options", "linear,mlp4,mlp4_only,mlp4_rl", "--batch-size", "4", "--mlp-steps", "30",
                 *ARGS]) == 0
    res = json.loads((tmp_path / "m.json").read_text())
    for layer, opts in res["layers"].items():
        for o in ("mlp4", "mlp4_only", "mlp4_rl"):
            assert -10 < opts[o]["r2"] <= 1 and 0 <= opts[o]["energy_pred@2"] <= 1 + 1e-6
            assert 0 <= res["mlp_fit"][layer][o]["best_step"] <= 30
    assert res["summary"]["mlp4"]["gap_closed@2"] is not None
    capsys.readouterr()
    for bad in ("mlp", "mlp0", "mlp4_foo"):
        assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "x"),
                     "--options", f"linear,{bad}", *ARGS]) == 2
        assert "options:" in capsys.readouterr().err


def test_mlp_serving_cost():
    c = serving_cost("mlp32", 256, 64, 8)
    assert c == {"features": 288, "macs_per_token": 32 * 256 + 8 * 288,
                 "bytes_per_layer": 2 * (32 * 256 + 32 + 64 * 289)}
    assert serving_cost("mlp16_only", 256, 64, 8)["macs_per_token"] == 16 * 256 + 8 * 16
    assert serving_cost("mlp16_rl", 256, 64, 8)["macs_per_token"] == 16 * 320 + 8 * 272
