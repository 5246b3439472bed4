"""The rank-R expert sketch (calibration/expert_sketch.py) and its predictor-study options."""

from __future__ import annotations

import json

import pytest
import torch

from base_sglang.calibration.expert_sketch import max_rank, sketch_factors, sketch_features
from base_sglang.calibration.predictor_study import main, serving_cost

ARGS = ["--num-seqs", "16", "--seq-len", "24", "--heldout-every", "4"]
ACT = torch.nn.functional.silu


def random_moe(seed: int, E: int = 3, I: int = 6, H: int = 16, T: int = 40, K: int = 2):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    gu, dn = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    z = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])  # [T, K]
    return gu, dn, z, ids


def exact_energy_and_norm(z, ids, gu, dn):
    """(log(sum_j h_j^2 ||d_j||^2 + eps^2), log(||E_u(z)|| + eps)), each [T, K], by the dense expert."""
    from base_sglang.core.moe_ref import expert_outputs

    gate, up = torch.einsum("th,tkoh->tko", z, gu[ids]).chunk(2, -1)  # [T, K, I] each
    q = ((ACT(gate) * up).square() * dn[ids].square().sum(2)).sum(-1)  # [T, K]
    return torch.log(q + 1e-12), torch.log(expert_outputs(z, ids, gu, dn).norm(dim=-1) + 1e-6)


@pytest.mark.parametrize("method", ["svd", "data"])
def test_full_rank_sketch_is_the_expert(method):
    gu, dn, z, ids = random_moe(0)  # 2I = 12 < H = 16: full rank 12
    r = max_rank(gu)
    assert r == 12
    A, B = sketch_factors(gu, r, method, z, ids)
    assert A.shape == (3, 12, 12) and B.shape == (3, 12, 16)
    torch.testing.assert_close(A @ B, gu, rtol=1e-4, atol=1e-4)
    q, o = sketch_features(z, ids, A, B, dn, ACT, out=True)
    q_true, o_true = exact_energy_and_norm(z, ids, gu, dn)
    torch.testing.assert_close(q, q_true, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o, o_true, rtol=1e-4, atol=1e-4)
    assert sketch_features(z, ids, A, B, dn, ACT)[1] is None


def test_sketch_error_shrinks_with_rank():
    gu, dn, z, ids = random_moe(1, E=1, I=8, H=24, T=200, K=1)  # every row routed to expert 0
    w = gu[0]  # [2I, H]
    q_true = exact_energy_and_norm(z, ids, gu, dn)[0]
    pre_err, feat_err = [], []
    for r in range(1, max_rank(gu) + 1):
        A, B = sketch_factors(gu, r)
        pre_err.append((z @ (w - A[0] @ B[0]).T).norm(dim=1))  # [T] pre-activation error per row
        feat_err.append(float((sketch_features(z, ids, A, B, dn, ACT)[0] - q_true).abs().mean()))
    for a, b in zip(pre_err, pre_err[1:]):  # dropped orthogonal components: non-increasing per row
        assert bool((b <= a + 1e-4).all())
    assert pre_err[-1].max() < 1e-3 and feat_err[-1] < 1e-4
    assert feat_err[0] > feat_err[3] > feat_err[7] > feat_err[11] > feat_err[-1]
    # the data-aware factors are the best rank-r fit of the fit rows' pre-activations
    for r in (2, 5, 9):
        sa, sb = sketch_factors(gu, r)
        da, db = sketch_factors(gu, r, "data", z, ids)
        p = z @ w.T  # [T, 2I]
        assert (p - z @ (da[0] @ db[0]).T).norm() <= (p - z @ (sa[0] @ sb[0]).T).norm() + 1e-4
        torch.testing.assert_close(da[0].T @ da[0], torch.eye(r), rtol=0, atol=1e-5)


def test_sketch_hidden_is_the_factorised_product():
    from base_sglang.calibration.expert_sketch import sketch_hidden

    gu, dn, z, ids = random_moe(2)
    A, B = sketch_factors(gu, 4)
    gate, up = (z @ (A[1] @ B[1]).T).chunk(2, -1)
    torch.testing.assert_close(sketch_hidden(z, A[1], B[1], ACT), ACT(gate) * up, rtol=1e-5, atol=1e-5)


def test_data_sketch_of_an_unrouted_expert_is_the_svd():
    gu, dn, z, _ = random_moe(3)
    ids = torch.zeros(40, 1, dtype=torch.long)  # only expert 0 is routed
    sa, sb = sketch_factors(gu, 3)
    da, db = sketch_factors(gu, 3, "data", z, ids)
    assert torch.equal(da[1:], sa[1:]) and torch.equal(db[1:], sb[1:])
    few = ids[:2]  # 2 rows < r = 3: the basis is completed to rank 3
    fa, fb = sketch_factors(gu, 3, "data", z[:2], few)
    torch.testing.assert_close(fa[0].T @ fa[0], torch.eye(3), rtol=0, atol=1e-5)


def test_sketch_serving_cost():
    H, E, K, I = 256, 64, 8, 64  # noqa: E741 (the proxy)
    c = serving_cost("sketch8", H, E, K, I)
    per = 8 * 256 + 2 * 64 * 8 + 64  # 3136
    assert c == {"features": 257, "macs_per_token": 8 * (per + 257),
                 "bytes_per_layer": 2 * 64 * (per + 258),
                 "expert_bytes_fraction": round(3136 / (3 * 64 * 256), 5)}
    assert c["expert_bytes_fraction"] == pytest.approx(0.06380, abs=1e-5)
    o = serving_cost("sketch16_only", H, E, K, I)
    assert o["features"] == 1 and o["macs_per_token"] == 8 * (16 * 256 + 2 * 64 * 16 + 64 + 1)
    assert o["bytes_per_layer"] == 2 * 64 * (16 * 256 + 2 * 64 * 16 + 64 + 2)
    q = serving_cost("sketch4", 2048, 128, 8, 768)  # Qwen3-30B-A3B
    assert q["macs_per_token"] == 8 * (4 * 2048 + 2 * 768 * 4 + 768 + 2049)
    assert q["expert_bytes_fraction"] == pytest.approx(15104 / (3 * 768 * 2048), abs=1e-5)
    so = serving_cost("sketcho4", H, E, K, I)  # the down product instead of the energy sum
    assert so["macs_per_token"] == 8 * (4 * 256 + 2 * 64 * 4 + 256 * 64 + 257)
    assert serving_cost("sketchd4", H, E, K, I) == serving_cost("sketch4", H, E, K, I)
    with pytest.raises(ValueError, match="intermediate size"):
        serving_cost("sketch4", H, E, K)


def test_bad_rank_names_the_field(capsys, tiny_ckpt, tiny_data, tmp_path):
    gu = random_moe(0)[0]
    for r in (0, 13):
        with pytest.raises(ValueError, match=r"sketch: r must be in 1\.\.12"):
            sketch_factors(gu, r)
    with pytest.raises(ValueError, match="sketch: method"):
        sketch_factors(gu, 2, "random")
    ckpt = tiny_ckpt("qwen3_moe")  # H = 32, I = 16: min(2I, H) = 32
    for bad, msg in (("sketch33", "min(2I, H) = 32"), ("sketch0", "sketch rank R >= 1"),
                     ("sketchx4", "sketchR / sketchR_only")):
        assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "x"),
                     "--options", f"linear,{bad}", *ARGS]) == 2
        err = capsys.readouterr().err
        assert "options:" in err and msg in err, err


def test_sketch_options_run_and_full_rank_out_is_exact(tiny_ckpt, tiny_data, tmp_path):
    ckpt = tiny_ckpt("qwen3_moe")  # H = 32, I = 16: full rank 32
    opts = "linear,sketch4,sketch4_only,sketchd4,sketcho32_only,sketch32_only,sketchd32_only"
    assert main(["--model", str(ckpt), "--data", str(tiny_data), "--out", str(tmp_path / "s"),
                 "--options", opts, "--batch-size", "4", *ARGS]) == 0
    res = json.loads((tmp_path / "s.json").read_text())
    for opts_ in res["layers"].values():
        assert opts_["sketcho32_only"]["r2"] == pytest.approx(1.0, abs=1e-3)  # y = log ||E_u||
        assert opts_["sketcho32_only"]["energy_pred@2"] == pytest.approx(
            opts_["linear"]["energy_oracle@2"], abs=1e-4)
        # at full rank both factorisations are W itself: the same column, the same fit
        assert opts_["sketchd32_only"]["r2"] == pytest.approx(opts_["sketch32_only"]["r2"], abs=1e-4)
        for o in ("sketch4", "sketch4_only", "sketchd4"):
            assert -10 < opts_[o]["r2"] <= 1 and 0 <= opts_[o]["energy_pred@2"] <= 1 + 1e-6
    assert res["summary"]["sketcho32_only"]["gap_closed@2"] == pytest.approx(1, abs=1e-3)
    assert res["cost"]["sketch4"]["expert_bytes_fraction"] == pytest.approx(
        (4 * 32 + 2 * 16 * 4 + 16) / (3 * 16 * 32), abs=1e-5)
