"""Kept-set variants of base_plus (issue 13): backfill-aware net loss, per-layer budget schedule.

Each variant keeps base_plus's backfill and combine rule and changes only which M experts are kept
(or, for the schedule, how many at this layer). selection.py calls them with the removal costs of the
policy: predicted (base_*) or true (oracle_*, the same rule with true expert-output norms).

  net    D_net(u; S) = sum over real routed pairs (t, u) of relu(c[t,u] - lambda * a_t(u; S)), where
         a_t is the contribution w~^2 ||E_b(z_t)||^2 of the expert b that takes u's slot in t's
         backfilled set: for u in S, t's next candidate (the (j+1)-th non-routed expert of t's
         preference order inside S, j = t's routed experts outside S); for u outside S, the j-th one
         (the backfill that u would push out again). w~ = p_b W / sum_{routed} p (the weight a
         backfilled expert gets before renormalisation). S_0 = top-M(D); S_i = top-M(D_net(.; S_{i-1}))
         for a constant number of iterations (ties broken by D).
  sched  the layer runs M_l = layer_budget[r, l, M] (a calibrated table with the same total over the
         layers as L * M; calibration/layer_schedule.py) of the step's batch-size range r, picked on
         the host from the step's row count (Predictor.layer_schedule); M >= E stays dense.

Shape legend: T tokens, K slots, E experts. Fixed shapes, no host synchronisation (CUDA-graph safe).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

TIE = 1e-6  # D's share in the net score: breaks ties among experts whose net loss is 0


def scheduled_budget(m: torch.Tensor, table: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[] int64 budget of this layer for batch budget m ([] int64); table [E+1] per-layer budgets."""
    idx = m.clamp(0, num_experts).reshape(1)  # [1] a gather, not an index (no host sync)
    m_l = table.to(m.device).gather(0, idx)[0].round().long().clamp(0, num_experts)  # []
    return torch.where(m >= num_experts, m, m_l)


def net_kept(d: torch.Tensor,  # [E] batch removal score D (predicted or true)
             cost: torch.Tensor,  # [T, K] removal cost c of each routed slot (same units as d)
             m: torch.Tensor,  # [] batch budget
             ids: torch.Tensor,  # [T, K] non-negative expert ids
             w: torch.Tensor,  # [T, K] routed weights (0 on -1 slots)
             valid: torch.Tensor,  # [T, K] routed slots of real rows
             real: torch.Tensor,  # [T]
             in_union: torch.Tensor,  # [E]
             logits: torch.Tensor,  # [T, E]
             routed_row: torch.Tensor,  # [T, E] expert routed by the row
             norm2: Callable[[torch.Tensor], torch.Tensor],  # [T] expert id -> [T] ||E(z_t)||^2
             lam: float, iters: int, top_m_mask: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """(net score [E] of the last iteration, kept mask [E])."""
    E = d.shape[0]
    p = torch.softmax(logits.float(), dim=-1)  # [T, E]
    total_p = (p.gather(1, ids) * valid).sum(1).clamp_min(1e-30)  # [T]
    scale = w.sum(1) / total_p  # [T] weight per unit p of a backfilled expert ("never" rule)
    rest = torch.sort(logits.float(), dim=1, descending=True, stable=True).indices  # [T, E]
    not_routed = ~routed_row.gather(1, rest)  # [T, E]
    onehot = (ids.unsqueeze(-1) == torch.arange(E, device=ids.device)) & valid.unsqueeze(-1)
    c = torch.where(valid, torch.nan_to_num(cost.float(), nan=0.0), torch.zeros_like(cost.float()))
    in_s = top_m_mask(d, m, in_union)  # [E] S_0 = BASE's kept set
    score = d.float()
    for _ in range(iters):
        cand = in_s[rest] & not_routed  # [T, E] backfill candidates in preference order
        pos = torch.cumsum(cand.int(), 1)  # [T, E] 1-based rank among the candidates
        j = (valid & ~in_s[ids]).sum(1)  # [T] routed experts of the row outside S

        a_in = _candidate_contribution(cand, pos, j + 1, rest, p, scale, real, norm2)  # [T]
        a_out = _candidate_contribution(cand, pos, j, rest, p, scale, real, norm2)  # [T]
        a = torch.where(in_s[ids], a_in[:, None], a_out[:, None])  # [T, K]
        net = (c - lam * a).clamp_min(0.0)  # [T, K]
        score = (onehot * net.unsqueeze(-1)).sum((0, 1)) + TIE * d.float()  # [E]
        in_s = top_m_mask(score, m, in_union)
    return score, in_s


def _candidate_contribution(cand, pos, r, rest, p, scale, real, norm2):
    """[T] w~^2 ||E_b||^2 of each row's r-th backfill candidate b (0 when it has none).

    cand, pos [T, E] candidates in preference order and their 1-based rank; r [T]; rest [T, E] the
    preference order; p [T, E] router probabilities; scale [T] weight per unit p."""
    hit = cand & (pos == r[:, None])  # [T, E]
    b = rest.gather(1, hit.int().argmax(1, keepdim=True)).squeeze(1)  # [T]
    wb = p.gather(1, b[:, None]).squeeze(1) * scale  # [T]
    a = torch.nan_to_num(wb.square() * norm2(b), nan=0.0)  # [T]
    return torch.where(hit.any(1) & real, a, torch.zeros_like(a))
