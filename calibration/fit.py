"""Closed-form fits from LayerStats, and the held-out quality statistics of the fitted predictor.

Shape legend: E experts, H hidden size, K routed slots, B decode-batch rows, S positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from base_sglang.calibration.collect import LOG_EPS, LayerStats
from base_sglang.core.selection import top_m_mask
from base_sglang.hf.blocks import routed_outputs

NEVER = 1e30  # ExFold: loss of never-observed pairs and of the diagonal


@dataclass
class LayerFit:
    weight: torch.Tensor  # [E, H] fp32
    bias: torch.Tensor  # [E] fp32
    expert_freq: torch.Tensor  # [E]
    expert_norm: torch.Tensor  # [E]
    sere_sim: torch.Tensor  # [E, E]
    exfold_coef: torch.Tensor  # [E, E]
    exfold_loss: torch.Tensor  # [E, E]
    stats: dict[str, float]


def fit_ridge(st: LayerStats, ridge: float) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Per-expert ridge of y = <a, z> + b: (A^T A + lam I_H (bias unpenalised)) theta = A^T y.

    lam_e = ridge * tr(Z_e^T Z_e) / H. Experts never routed get a = 0, b = the layer's mean target.
    Returns weight [E, H], bias [E] (fp32) and training-set fit numbers.
    """
    E, H = st.E, st.H
    seen = st.n > 0  # [E]
    total_n = st.n.sum().clamp_min(1)
    y_mean = (st.zy[:, H].sum() / total_n).item()  # mean target over all routed pairs
    f64 = dict(dtype=torch.float64, device=st.zz.device)
    theta = torch.zeros(E, H + 1, **f64)
    theta[:, H] = y_mean
    eye = torch.zeros(H + 1, H + 1, **f64)
    eye[:H, :H] = torch.eye(H, **f64)
    for e in seen.nonzero().squeeze(1).tolist():
        lam = ridge * st.zz[e, :H, :H].diagonal().sum() / H
        a = st.zz[e] + lam * eye  # [H+1, H+1]
        theta[e] = torch.linalg.lstsq(a, st.zy[e].unsqueeze(1)).solution.squeeze(1)
    # training R^2 from the sufficient statistics: sse = yy - 2 theta.zy + theta^T zz theta
    sse = st.yy - 2 * (theta * st.zy).sum(1) + torch.einsum("ei,eij,ej->e", theta, st.zz, theta)
    sst_within = st.yy - st.zy[:, H].square() / st.n.clamp_min(1)
    sst = st.yy.sum() - st.zy[:, H].sum().square() / total_n
    stats = {
        "fit_pairs": float(st.n.sum()),
        "experts_seen": float(seen.sum()),
        "r2_train": float(1 - sse[seen].sum() / sst.clamp_min(1e-30)),
        "r2_within_train": float(1 - sse[seen].sum() / sst_within[seen].sum().clamp_min(1e-30)),
    }
    return theta[:, :H].float(), theta[:, H].float(), stats


def exfold_stats(st: LayerStats, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ExFold coef/loss [E, E] (algorithms.md section 5)."""
    coef = (st.ex_uv / (st.ex_vv + lam)).clamp(-4.0, 4.0)
    loss = (st.ex_uu - 2 * coef * st.ex_uv + coef.square() * st.ex_vv) / st.ex_uu.clamp_min(1e-30)
    never = st.ex_n == 0
    coef = torch.where(never, torch.zeros_like(coef), coef)
    loss = torch.where(never, torch.full_like(loss, NEVER), loss)
    eye = torch.eye(st.E, dtype=torch.bool, device=coef.device)
    coef[eye] = 1.0
    loss[eye] = NEVER
    return coef.float(), loss.float()


def sere_similarity(st: LayerStats, metric: str) -> torch.Tensor:
    """SERE similarity [E, E] from the all-expert Gram matrix; diagonal 1.

    frobenius: sim = 1 - ||O_e - O_f||_F / max pair distance.   cosine: <O_e, O_f> / |O_e| |O_f|.
    """
    g = st.gram
    d = g.diagonal()
    if metric == "cosine":
        sim = g / (d[:, None] * d[None, :]).sqrt().clamp_min(1e-30)
    else:
        dist = (d[:, None] + d[None, :] - 2 * g).clamp_min(0).sqrt()
        sim = 1 - dist / dist.max().clamp_min(1e-30)
    sim.fill_diagonal_(1.0)
    return sim.float()


def finish_layer(st: LayerStats, ridge: float, exfold_lambda: float, sere_metric: str) -> LayerFit:
    weight, bias, stats = fit_ridge(st, ridge)
    freq = (st.count / st.count.sum().clamp_min(1)).float()
    norm = (st.norm_sum / st.count.clamp_min(1)).float()
    coef, loss = exfold_stats(st, exfold_lambda)
    stats["sere_tokens"] = float(st.sere_seen)
    return LayerFit(weight, bias, freq, norm, sere_similarity(st, sere_metric), coef, loss, stats)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (ties broken by position; floats rarely tie)."""
    if a.numel() < 2:
        return float("nan")

    def ranks(v):
        r = torch.empty_like(v, dtype=torch.float64)
        r[v.argsort()] = torch.arange(v.numel(), dtype=torch.float64, device=v.device)
        return r

    ra, rb = ranks(a.double()), ranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()).clamp_min(1e-30))


class HeldoutStats:
    """Held-out quality of one layer's fitted predictor.

    Pairs: true vs predicted log-norm and removal cost c = w^2 ||E_u||^2 for every routed pair.
    Batches: the held-out forward holds B sequences; the B tokens at one position form a decode batch,
    for which the batch scores D_u (true, predicted, router-weight sum, static w^2 h^2) are built and
    the true removal energy kept by each score's top-M is recorded.
    """

    def __init__(self, fit: LayerFit, budgets: tuple[int, ...]):
        self.fit = fit
        self.budgets = budgets
        self.y, self.yhat, self.e, self.c, self.chat = [], [], [], [], []
        self.kept = {(s, m): 0.0 for s in ("base", "oracle", "gate_sum", "static") for m in budgets}
        self.energy_total = 0.0
        self.batch_rho: list[float] = []
        self.union: list[float] = []

    def update(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, experts, rows: int):
        """x [T, H], weights/ids [T, K], T = rows * S tokens laid out row-major ([rows, S])."""
        T, K = ids.shape
        S = T // rows
        E = self.fit.weight.shape[0]
        ids = ids.long()
        w = weights.float()
        true = routed_outputs(x, ids, experts).norm(dim=-1)  # [T, K]
        yhat = torch.einsum("th,tkh->tk", x.float(), self.fit.weight[ids]) + self.fit.bias[ids]
        c_true = w.square() * true.square()  # [T, K]
        c_pred = w.square() * torch.exp(2 * yhat)  # [T, K]
        self.y.append(torch.log(true + LOG_EPS).reshape(-1))
        self.yhat.append(yhat.reshape(-1))
        self.e.append(ids.reshape(-1))
        self.c.append(c_true.reshape(-1))
        self.chat.append(c_pred.reshape(-1))

        def batch_score(v):  # [T, K] -> [S, E]: sum over the rows at each position
            v = v.view(rows, S, K).permute(1, 0, 2).reshape(S, rows * K)
            idx = ids.view(rows, S, K).permute(1, 0, 2).reshape(S, rows * K)
            return torch.zeros(S, E, device=ids.device).scatter_add_(1, idx, v.float())

        d_true = batch_score(c_true)  # [S, E]
        scores = {"base": batch_score(c_pred), "oracle": d_true, "gate_sum": batch_score(w),
                  "static": batch_score(w.square() * self.fit.expert_norm[ids].square())}
        in_union = batch_score(torch.ones_like(w)) > 0  # [S, E]
        self.union.extend(in_union.sum(1).float().tolist())
        self.energy_total += float(d_true.sum())
        for (name, m) in self.kept:
            keep = top_m_mask(scores[name], m, in_union)
            self.kept[(name, m)] += float((d_true * keep).sum())
        for s in range(S):
            u = in_union[s]
            if u.sum() > 2:
                self.batch_rho.append(spearman(scores["base"][s][u], d_true[s][u]))

    def result(self) -> dict[str, float]:
        y, yhat, e = torch.cat(self.y).double(), torch.cat(self.yhat).double(), torch.cat(self.e)
        E = self.fit.weight.shape[0]
        sse = (y - yhat).square().sum()
        cnt = torch.bincount(e, minlength=E).double()
        mean_e = torch.zeros(E, dtype=torch.float64, device=e.device).index_add_(0, e, y) / cnt.clamp_min(1)
        out = {
            "heldout_pairs": float(y.numel()),
            "r2": float(1 - sse / (y - y.mean()).square().sum().clamp_min(1e-30)),
            "r2_within": float(1 - sse / (y - mean_e[e]).square().sum().clamp_min(1e-30)),
            "spearman_cost": spearman(torch.cat(self.chat), torch.cat(self.c)),
            "spearman_lognorm": spearman(yhat, y),
            "spearman_batch": float(torch.tensor(self.batch_rho).nanmean()) if self.batch_rho else float("nan"),
            "union_mean": float(torch.tensor(self.union).mean()) if self.union else float("nan"),
        }
        for (name, m), kept in self.kept.items():
            out[f"energy_{name}@{m}"] = kept / max(self.energy_total, 1e-30)
        return out
