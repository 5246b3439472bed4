"""Closed-form statistics against brute force and a synthetic case with known log-norm structure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from base_sglang.calibration.collect import LayerStats
from base_sglang.calibration.fit import (
    NEVER,
    HeldoutStats,
    exfold_stats,
    finish_layer,
    fit_ridge,
    sere_similarity,
    spearman,
)
from base_sglang.hf.blocks import routed_outputs


def exp_experts(a: torch.Tensor, dirs: torch.Tensor):
    """Experts with E_u(z) = dirs[u] * exp(<a_u, z>) when z[-1] == 1: log||E_u|| is linear in z.

    a [E, H] (last column acts as a bias through z[-1] = 1), dirs [E, H] unit-free directions.
    gate row = a_u, up row = e_last (so up(z) = 1), act = exp, down column = dirs[u].
    """
    E, H = a.shape
    up = torch.zeros(E, 1, H)
    up[:, 0, -1] = 1.0
    gate_up = torch.cat([a.unsqueeze(1), up], 1)  # [E, 2, H]
    down = dirs.unsqueeze(-1)  # [E, H, 1]
    return SimpleNamespace(gate_up_proj=gate_up, down_proj=down, act_fn=torch.exp)


def tokens(T, H, g):
    z = torch.randn(T, H, generator=g)
    z[:, -1] = 1.0
    return z


def test_ridge_recovers_known_linear_log_norm():
    g = torch.Generator().manual_seed(0)
    E, H, K, T = 6, 12, 2, 3000
    a = 0.3 * torch.randn(E, H, generator=g)
    dirs = torch.randn(E, H, generator=g)
    ex = exp_experts(a, dirs)
    st = LayerStats(E, H, sere_tokens=0)
    for _ in range(3):
        z = tokens(T // 3, H, g)
        ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T // 3)])  # [T, K]
        st.update(z, ids, ex)
    weight, bias, stats = fit_ridge(st, ridge=1e-6)
    assert stats["r2_train"] > 0.999 and stats["r2_within_train"] > 0.999
    z = tokens(500, H, g)  # fresh tokens: predictions match the true log-norm
    truth = z @ a.T + dirs.norm(dim=1).log()  # [500, E]
    pred = z @ weight.T + bias  # [500, E]
    assert torch.allclose(pred, truth, atol=2e-3)


def test_ridge_penalty_shrinks_and_unseen_expert_gets_mean():
    g = torch.Generator().manual_seed(1)
    E, H = 4, 8
    ex = exp_experts(0.5 * torch.randn(E, H, generator=g), torch.randn(E, H, generator=g))
    st = LayerStats(E, H, sere_tokens=0)
    z = tokens(400, H, g)
    ids = torch.randint(0, 3, (400, 1), generator=g)  # expert 3 is never routed
    st.update(z, ids, ex)
    w_small, _, _ = fit_ridge(st, ridge=1e-6)
    w_big, b_big, _ = fit_ridge(st, ridge=10.0)
    assert w_big[:3].norm() < 0.5 * w_small[:3].norm()
    assert torch.all(w_big[3] == 0)
    assert b_big[3] == pytest.approx(float(st.zy[:, H].sum() / st.n.sum()), rel=1e-5)


def _random_experts(E, H, Im, g):
    return SimpleNamespace(gate_up_proj=torch.randn(E, 2 * Im, H, generator=g) / H ** 0.5,
                           down_proj=torch.randn(E, H, Im, generator=g) / Im ** 0.5,
                           act_fn=torch.nn.functional.silu)


def test_exfold_and_sere_match_brute_force():
    g = torch.Generator().manual_seed(2)
    E, H, Im, K, T = 5, 8, 6, 3, 40
    ex = _random_experts(E, H, Im, g)
    z = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    st = LayerStats(E, H, sere_tokens=25)
    st.update(z, ids, ex)
    coef, loss = exfold_stats(st, lam=1e-3)
    outs = routed_outputs(z, ids, ex).double()  # [T, K, H]
    for s, t in [(ids[0, 0].item(), ids[0, 1].item()), (ids[3, 2].item(), ids[3, 0].item())]:
        uv = vv = uu = 0.0
        for i in range(T):
            row = ids[i].tolist()
            if s in row and t in row:
                u, v = outs[i, row.index(s)], outs[i, row.index(t)]
                w = u.norm()
                uv, vv, uu = uv + w * (u @ v), vv + w * (v @ v), uu + w * (u @ u)
        c = max(-4.0, min(4.0, float(uv / (vv + 1e-3))))
        assert coef[s, t].item() == pytest.approx(c, rel=1e-4)
        assert loss[s, t].item() == pytest.approx(float((uu - 2 * c * uv + c * c * vv) / uu), rel=1e-4)
    assert torch.all(coef.diagonal() == 1) and torch.all(loss.diagonal() == NEVER)
    pair_seen = torch.zeros(E, E, dtype=torch.bool)
    for row in ids.tolist():
        for p in row:
            for q in row:
                pair_seen[p, q] = True
    assert torch.all(loss[~pair_seen] == NEVER) and torch.all(coef[~pair_seen] == 0)

    # SERE: Frobenius distance of every expert's outputs on the first 25 tokens
    full = torch.stack([routed_outputs(z[:25], torch.full((25, 1), e), ex)[:, 0] for e in range(E)])
    dist = torch.cdist(full.reshape(E, -1).double(), full.reshape(E, -1).double())
    sim = sere_similarity(st, "frobenius")
    assert torch.allclose(sim.double(), 1 - dist / dist.max(), atol=1e-5)
    assert torch.all(sim.diagonal() == 1) and sim.min() >= 0 and sim.max() <= 1
    cos = sere_similarity(st, "cosine")
    f = torch.nn.functional.normalize(full.reshape(E, -1).double(), dim=1)
    expect = f @ f.T
    expect.fill_diagonal_(1.0)
    assert torch.allclose(cos.double(), expect, atol=1e-5)


def test_heldout_energy_oracle_dominates_and_spearman():
    g = torch.Generator().manual_seed(3)
    E, H, Im, K, rows, S = 8, 10, 6, 2, 4, 12
    ex = _random_experts(E, H, Im, g)
    st = LayerStats(E, H, sere_tokens=0)
    z = torch.randn(400, H, generator=g)
    logits = z @ torch.randn(H, E, generator=g)
    ids = logits.topk(K, dim=1).indices
    st.update(z, ids, ex)
    fit = finish_layer(st, 1e-3, 1e-3, "frobenius")
    assert fit.expert_freq.sum().item() == pytest.approx(1.0, abs=1e-6)
    hs = HeldoutStats(fit, budgets=(2, 4))
    zt = torch.randn(rows * S, H, generator=g)
    lt = zt @ torch.randn(H, E, generator=g)
    w, it = torch.softmax(lt, -1).topk(K, dim=1)
    hs.update(zt, w, it, ex, rows)
    res = hs.result()
    for m in (2, 4):  # the oracle keeps the most true energy by construction
        for name in ("base", "gate_sum", "static"):
            assert res[f"energy_oracle@{m}"] >= res[f"energy_{name}@{m}"] - 1e-9
        assert 0 < res[f"energy_base@{m}"] <= 1
    assert res["energy_oracle@4"] > res["energy_oracle@2"]
    assert -1 <= res["spearman_cost"] <= 1 and res["heldout_pairs"] == rows * S * K


def test_routed_outputs_gather_and_loop_agree_with_core_reference():
    from base_sglang.core import expert_output_norms

    g = torch.Generator().manual_seed(4)
    ex = _random_experts(16, 10, 6, g)
    x = torch.randn(20, 10, generator=g)
    ids = torch.randint(0, 16, (20, 3), generator=g)
    gathered = routed_outputs(x, ids, ex)  # 20 tokens: all experts on all tokens, then gathered
    looped = routed_outputs(x, ids, ex, dense_tokens=0)  # per-expert loop path
    assert torch.allclose(gathered, looped, atol=1e-5)
    ref = expert_output_norms(x, ids, ex.gate_up_proj, ex.down_proj, ex.act_fn)
    assert torch.allclose(gathered.norm(dim=-1), ref, rtol=1e-5)


def test_spearman_is_rank_based():
    x = torch.linspace(-3, 3, 50)
    assert spearman(x, torch.exp(x)) == pytest.approx(1.0)
    assert spearman(x, -x ** 3) == pytest.approx(-1.0)


def test_constant_row_weights_leave_the_ridge_fit_unchanged():
    g = torch.Generator().manual_seed(5)
    E, H = 4, 6
    ex = _random_experts(E, H, 5, g)
    z = torch.randn(300, H, generator=g)
    ids = torch.randint(0, E, (300, 2), generator=g)
    plain, weighted, skewed = (LayerStats(E, H, 0), LayerStats(E, H, 0, weight_power=1.0),
                               LayerStats(E, H, 0, weight_power=2.0))
    plain.update(z, ids, ex)
    weighted.update(z, ids, ex, torch.full((300, 2), 0.3))
    skewed.update(z, ids, ex, torch.rand(300, 2, generator=g))
    a, b, _ = fit_ridge(plain, 1e-3)
    a2, b2, _ = fit_ridge(weighted, 1e-3)
    a3, _, _ = fit_ridge(skewed, 1e-3)
    assert torch.allclose(a, a2, atol=1e-5) and torch.allclose(b, b2, atol=1e-5)
    assert not torch.allclose(a, a3, atol=1e-3)  # non-constant weights do change the fit
