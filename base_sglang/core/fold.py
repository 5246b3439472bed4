"""base_fold (issue 13): BASE's kept set, each dropped routed slot folded into a kept expert (ExFold).

base_fold keeps base_plus's kept set S = top-M(D) (selection.py). A routed slot (t, j) of an expert u
outside S is not backfilled with t's next-preferred expert in S; it is replaced by the kept expert

    q* = argmin_{q in S, q not among t's slots} loss[u, q]      weight w[t, j] * coef[u, q*]

with ExFold's calibrated pair statistics (shared/docs/algorithms.md section 5: coef[u, q] is the
least-squares scale of E_q onto E_u, loss[u, q] the relative residual). A slot folds only when
coef[u, q*] > 0 and loss[u, q*] < max_loss (1.0: every fold that recovers anything); the others are
dropped (fallback "drop") or backfilled from t's preference order inside S, as base_plus does
(fallback "backfill": the hybrid). Slots are visited heaviest first, so two dropped slots of one token
never fold into the same expert, and a backfill never repeats a fold.

Combine weights (mode):
  never    kept slots keep w, folded slots w * coef, backfilled ones p * W / sum_routed p (ExFold's
           rule: no renormalisation)
  partial  the unfolded slots (kept and backfilled) are scaled by ((W - F) / U) ** alpha, where
           F = sum of the folded weights and U = sum of the unfolded "never" weights: they take the
           share of the token's weight W that the folds do not carry; the folded weights stay w * coef
  always   partial with alpha = 1
Rows where nothing moved keep the router's weights exactly.

Shape legend: T tokens, K slots, E experts. Fixed shapes, a constant loop over the K slots, no host
synchronisation (CUDA-graph safe).
"""

from __future__ import annotations

import torch

from .config import FOLD_FALLBACKS

FOLD_MODES = ("never", "partial", "always")


def fold_slots(ids: torch.Tensor,  # [T, K] non-negative routed ids (every use masked by valid)
               w: torch.Tensor,  # [T, K] fp32 routed weights, 0 on -1 slots
               valid: torch.Tensor,  # [T, K] routed slots of real rows
               in_s: torch.Tensor,  # [E] kept set S
               loss: torch.Tensor,  # [E, E] fp32 ExFold relative residual u -> q (>= 1: useless)
               coef: torch.Tensor,  # [E, E] fp32 ExFold fold coefficient u -> q
               logits: torch.Tensor,  # [T, E] router logits (backfill order and p)
               *, max_loss: float, fallback: str, mode: str,
               alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [T, K] int64 with -1 = dropped, weights [T, K] fp32) after folding the slots outside S."""
    if fallback not in FOLD_FALLBACKS:
        raise ValueError(f"fold_fallback: must be one of {FOLD_FALLBACKS}, got {fallback!r}")
    if mode not in FOLD_MODES:
        raise ValueError(f"renorm: base_fold combines with one of {FOLD_MODES}, got {mode!r}")
    T, K = ids.shape
    E = in_s.shape[0]
    dev = ids.device
    kept = valid & in_s[ids]  # [T, K] routed slots that stay
    drop = valid & ~in_s[ids]  # [T, K] routed slots outside S
    ar_e = torch.arange(E, device=dev)
    ar_k = torch.arange(K, device=dev)
    occupied = ((ids.unsqueeze(-1) == ar_e) & kept.unsqueeze(-1)).any(1)  # [T, E] t's kept experts
    new_ids = torch.where(kept, ids, torch.full_like(ids, -1))  # [T, K]
    new_w = torch.where(kept, w, torch.zeros_like(w))  # [T, K] the "never" weights
    folded = torch.zeros_like(kept)  # [T, K]
    order = torch.sort(w, dim=1, descending=True, stable=True).indices  # [T, K] heaviest slot first
    inf = torch.full((T, E), float("inf"), device=dev)
    for r in range(K):
        j = order[:, r:r + 1]  # [T, 1] slot visited now
        u = ids.gather(1, j)[:, 0]  # [T]
        cand = torch.where(in_s[None, :] & ~occupied, loss[u], inf)  # [T, E]
        best, q = cand.min(1)  # [T]
        c = coef[u, q]  # [T]
        ok = drop.gather(1, j)[:, 0] & (best < max_loss) & (c > 0)  # [T] the slot folds into q
        at = (ar_k == j) & ok[:, None]  # [T, K]
        new_ids = torch.where(at, q[:, None], new_ids)
        new_w = torch.where(at, (w.gather(1, j)[:, 0] * c)[:, None], new_w)
        folded = folded | at
        occupied = occupied | ((ar_e == q[:, None]) & ok[:, None])  # [T, E]
    p = torch.softmax(logits.float(), dim=-1)  # [T, E]
    total_w = w.sum(1, keepdim=True)  # [T, 1] the token's routed weight W
    if fallback == "backfill":
        need = drop & ~folded  # [T, K] slots left empty by the folds
        rest = torch.sort(logits.float(), dim=1, descending=True, stable=True).indices  # [T, E]
        cand = in_s[rest] & ~occupied.gather(1, rest)  # [T, E] kept experts t does not run yet
        pos = torch.cumsum(cand.int(), 1) - 1  # [T, E] rank among the candidates
        take = cand & (pos < K)  # [T, E]
        col = torch.where(take, pos, torch.full_like(pos, K)).long()  # [T, E]; K = discard column
        table = torch.full((T, K + 1), -1, dtype=ids.dtype, device=dev)  # [T, K+1]
        table.scatter_(1, col, torch.where(take, rest, torch.full_like(rest, -1)))
        slot = (torch.cumsum(need.int(), 1) - 1).clamp(0, K)  # [T, K] index among the empty slots
        b = torch.where(need, table.gather(1, slot.long()), torch.full_like(ids, -1))  # [T, K]
        total_p = (p.gather(1, ids) * valid).sum(1, keepdim=True).clamp_min(1e-30)  # [T, 1]
        wb = p.gather(1, b.clamp_min(0)) * (total_w / total_p)  # [T, K] base_plus's "never" weight
        new_ids = torch.where(b >= 0, b, new_ids)
        new_w = torch.where(b >= 0, wb, new_w)
    if mode != "never":
        a = 1.0 if mode == "always" else alpha
        f = (new_w * folded).sum(1, keepdim=True)  # [T, 1] weight carried by the folds
        unf = (new_w * ~folded).sum(1, keepdim=True).clamp_min(1e-30)  # [T, 1]
        scale = ((total_w - f) / unf).clamp_min(0.0).pow(a)  # [T, 1]
        new_w = torch.where(folded, new_w, new_w * scale)
    new_w = torch.where(new_ids >= 0, new_w, torch.zeros_like(new_w))
    unchanged = (new_ids == torch.where(valid, ids, torch.full_like(ids, -1))).all(1, keepdim=True)
    return new_ids, torch.where(unchanged, w, new_w)
