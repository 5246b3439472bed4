"""A trained shared projection plus per-expert heads for the log-norm predictor (issue 13 study option).

    yhat_u(z) = a_u . z + c_u . silu(P x + q) + b_u     x = z (mlpR) or [z, router logits] (mlpR_rl)
    yhat_u(z) =           c_u . silu(P x + q) + b_u     (mlpR_only)

P [R, D] and q [R] are shared by the experts of one layer; a_u [H], c_u [R], b_u are per expert. Trained
by full-batch Adam (float32, CPU) on the routed pairs' y = log(||E_u(z)|| + LOG_EPS) with the ridge's
penalty on a_u (lambda_u = ridge tr(Z_u^T Z_u) / H, as in the `linear` fit) plus weight decay on c_u and P,
initialised at the ridge fit (c = 0, P small random). The number of steps is chosen on a validation
slice of the FIT rows (the last windows); the model is then refitted on all fit rows for that many steps.
Inputs are standardised inside; the returned parameters act on raw inputs, so serving computes exactly
f(z) = [z, silu(P x + q)] and a per-expert dot product with [a_u, c_u, b_u].

Shape legend: T tokens, K routed slots, E experts, H hidden size, D nonlinearity input size, R rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

silu = torch.nn.functional.silu


@dataclass(frozen=True)
class MLPConfig:
    """max_steps: full-batch Adam steps of the selection run; lr (P, q, c) and lr_linear (a, b, on
    standardised z); weight_decay: relative L2 on c_u (times n_u) and on P; val_fraction of the fit
    tokens (the last ones, whole windows) picks the step count; eval_every / patience in steps."""

    max_steps: int = 400
    lr: float = 1e-2
    lr_linear: float = 1e-3
    weight_decay: float = 1e-3
    val_fraction: float = 0.1
    eval_every: int = 10
    patience: int = 80
    seed: int = 0

    def __post_init__(self):
        if self.max_steps < 1 or self.eval_every < 1 or self.patience < 1:
            raise ValueError("mlp: max_steps, eval_every and patience must be >= 1")
        if not 0 < self.val_fraction < 1:
            raise ValueError(f"mlp: val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.lr <= 0 or self.lr_linear <= 0 or self.weight_decay < 0:
            raise ValueError("mlp: lr, lr_linear must be > 0 and weight_decay >= 0")


@dataclass
class MLPFit:
    proj: torch.Tensor  # [R, D] acts on raw x
    shift: torch.Tensor  # [R] q
    theta: torch.Tensor  # [E, H+R+1] (a, c, b) or [E, R+1] (c, b) for only
    info: dict


def mlp_features(x: torch.Tensor, z: torch.Tensor | None, proj: torch.Tensor, shift: torch.Tensor):
    """f [T, H+R] = [z, silu(x P^T + q)] (or [T, R] without z). x [T, D], z [T, H]."""
    s = silu(x.float() @ proj.T + shift)  # [T, R]
    return s if z is None else torch.cat([z.float(), s], 1)


class _Model:
    """The parameters on standardised inputs and the loss of one token range."""

    def __init__(self, xs, zs, ids, y, E, R, theta_lin, lam_a, cfg: MLPConfig):
        g = torch.Generator().manual_seed(cfg.seed)
        self.xs, self.zs, self.ids, self.y, self.cfg = xs, zs, ids, y, cfg
        D = xs.shape[1]
        self.P = (torch.randn(R, D, generator=g) / D ** 0.5).requires_grad_()  # [R, D]
        self.q = torch.zeros(R, requires_grad=True)  # [R]
        self.c = torch.zeros(E, R, requires_grad=True)  # [E, R]
        self.b = theta_lin[:, -1].clone().requires_grad_()  # [E]
        self.a = None if zs is None else theta_lin[:, :-1].clone().requires_grad_()  # [E, H]
        self.lam_a = lam_a  # [E] ridge penalty per expert (standardised a: divided by sd^2 outside)

    def params(self):
        return [p for p in (self.a, self.b) if p is not None], [self.P, self.q, self.c]

    def predict(self, rows: slice):  # -> [T', K]
        s = silu(self.xs[rows] @ self.P.T + self.q)  # [T', R]
        full = s @ self.c.T + self.b  # [T', E]
        if self.a is not None:
            full = full + self.zs[rows] @ self.a.T
        return full.gather(1, self.ids[rows])

    def loss(self, rows: slice, n_u: torch.Tensor, sd2: torch.Tensor | None):
        err = (self.predict(rows) - self.y[rows]).square().mean()
        n = float(n_u.sum())
        pen = self.cfg.weight_decay * ((n_u * self.c.square().sum(1)).sum() / n + self.P.square().mean())
        if self.a is not None:
            pen = pen + (self.lam_a * (self.a.square() / sd2).sum(1)).sum() / n
        return err + pen, err


def _counts(ids: torch.Tensor, E: int) -> torch.Tensor:
    return torch.bincount(ids.reshape(-1), minlength=E).float()  # [E]


def fit_mlp(x: torch.Tensor, z: torch.Tensor | None, ids: torch.Tensor, y: torch.Tensor, E: int, R: int,
            ridge_lam: float, ridge_fit, cfg: MLPConfig, window: int) -> MLPFit:
    """Fit one layer. x [T, D] nonlinearity input, z [T, H] linear input (None: mlpR_only), ids [T, K],
    y [T, K] targets; ridge_fit(T') -> theta [E, H+1] (or [E, 1]) of the ridge on the first T' tokens;
    window = tokens per calibration window (the validation slice is whole windows)."""
    T = x.shape[0]
    n_val = max(1, round(T / window * cfg.val_fraction)) * window
    if n_val >= T:
        raise ValueError(f"mlp: {T} fit tokens are too few for a validation slice of {n_val}")
    mu_x, sd_x = x.float().mean(0), x.float().std(0).clamp_min(1e-6)  # [D]
    xs = (x.float() - mu_x) / sd_x
    if z is not None:
        mu_z, sd_z = z.float().mean(0), z.float().std(0).clamp_min(1e-6)  # [H]
        zs, sd2 = (z.float() - mu_z) / sd_z, sd_z.square()
    else:
        zs = sd2 = None
    y = y.float()

    def standardise(theta):  # raw-z ridge theta -> (a on zs, b)
        if z is None:
            return theta
        a, b = theta[:, :-1], theta[:, -1]
        return torch.cat([a * sd_z, (b + a @ mu_z)[:, None]], 1)

    def lam(rows):  # [E] ridge lambda per expert: ridge * tr(Z_u^T Z_u) / H on raw z
        if z is None:
            return None
        zn = z[rows].float().square().sum(1)  # [T']
        tr = torch.zeros(E).index_add_(0, ids[rows].reshape(-1), zn.repeat_interleave(ids.shape[1]))
        return ridge_lam * tr / z.shape[1]

    def train(rows: slice, steps: int, val: slice | None):
        m = _Model(xs, zs, ids, y, E, R, standardise(ridge_fit(rows.stop)), lam(rows), cfg)
        lin, nonlin = m.params()
        opt = torch.optim.Adam([{"params": lin, "lr": cfg.lr_linear}, {"params": nonlin, "lr": cfg.lr}])
        n_u = _counts(ids[rows], E)
        hist, best, since = [], (float("inf"), 0), 0
        for step in range(steps + 1):
            if val is not None and step % cfg.eval_every == 0:
                with torch.no_grad():
                    v = float((m.predict(val) - y[val]).square().mean())
                hist.append((step, v))
                best, since = ((v, step), 0) if v < best[0] else (best, since + cfg.eval_every)
                if since >= cfg.patience:
                    break
            if step == steps:
                break
            opt.zero_grad()
            m.loss(rows, n_u, sd2)[0].backward()
            opt.step()
        return m, best, hist

    _, (best_val, best_step), hist = train(slice(0, T - n_val), cfg.max_steps, slice(T - n_val, T))
    m, _, _ = train(slice(0, T), best_step, None)
    with torch.no_grad():
        mse_train = float((m.predict(slice(0, T)) - y).square().mean())
        proj = m.P / sd_x  # [R, D] on raw x
        shift = m.q - proj @ mu_x  # [R]
        heads = [m.c, m.b[:, None]]
        if z is not None:
            a = m.a / sd_z  # [E, H]
            heads = [a, m.c, (m.b - a @ mu_z)[:, None]]
        theta = torch.cat(heads, 1).detach()
    info = {"best_step": best_step, "val_mse": best_val, "val_mse_step0": hist[0][1],
            "train_mse": mse_train, "val_tokens": n_val, "steps_run": hist[-1][0]}
    return MLPFit(proj.detach(), shift.detach(), theta, info)
