"""Error-targeted budgets: the smallest batch budget M that keeps each row's predicted error in bound.

A row may carry, instead of an expert count, a bound eps_t on its predicted relative error in one MoE
layer: the share of its removal cost that falls on experts outside the kept set,
    err_t(M) = sum_k c[t,k] [rank(ids[t,k]) >= M] / sum_k c[t,k],
where c[t,k] = w^2 ||E_u(z_t)||^2 is the policy's removal cost (predicted for base / base_plus, true for
the oracle) and rank() orders the union experts by the policy's batch score D (the order top-M keeps
them in). err_t is non-increasing in M, so the smallest M with err_t(M) <= eps_t is one of 0 and
rank(ids[t,k]) + 1; the row then asks for min(that M, its integer budget), which acts as its cap. The
batch budget is still the largest request of the real rows, so every bounded row is met (or capped).

Shape legend: T tokens, K slots, E experts. Fixed shapes, no host synchronisation: the [T, K, K]
comparison replaces a per-row sort, so the call is CUDA-graph safe.
"""

from __future__ import annotations

import torch


def score_rank(score: torch.Tensor, in_union: torch.Tensor) -> torch.Tensor:
    """[E] position of each expert in the top-M order (0 = kept first; ties to the lower id)."""
    E = score.shape[0]
    masked = torch.where(in_union, score.float(), torch.full_like(score.float(), -float("inf")))
    order = torch.sort(masked, descending=True, stable=True).indices  # [E]
    return torch.empty_like(order).scatter_(0, order, torch.arange(E, device=score.device))


def error_budgets(cost: torch.Tensor,  # [T, K] removal cost of each routed slot
                  ids: torch.Tensor,  # [T, K] non-negative expert ids
                  valid: torch.Tensor,  # [T, K] routed slots of real rows
                  rank: torch.Tensor,  # [E] score_rank of the policy's batch score
                  max_error: torch.Tensor,  # [T] float bound; NaN = the row has no bound
                  budget: torch.Tensor,  # [T] int budgets (the cap of a bounded row)
                  ) -> torch.Tensor:
    """[T] int: each bounded row's smallest budget meeting its bound (capped by its budget); the
    other rows' budgets unchanged."""
    c = torch.where(valid, torch.nan_to_num(cost.float(), nan=0.0), torch.zeros_like(cost.float()))
    r = torch.where(valid, rank[ids], torch.full_like(ids, -1))  # [T, K]; -1 never removed
    total = c.sum(1)  # [T]
    # err at M = r[t,k] + 1: the cost of the slots ranked strictly after slot k
    later = r[:, None, :] > r[:, :, None]  # [T, K(k), K(j)] slot j ranked after slot k
    err_at = (later * c[:, None, :]).sum(2) / total.clamp_min(1e-30)[:, None]  # [T, K]
    eps = max_error.float()[:, None]  # [T, 1]
    ok = valid & (err_at <= eps)  # [T, K] M = r + 1 meets the bound
    big = budget.new_full((), 1 << 30)
    cand = torch.where(ok, (r + 1).to(budget.dtype), big)  # [T, K]
    need = cand.amin(1)  # [T] smallest M that meets the bound among the slots' thresholds
    need = torch.where(eps[:, 0] >= 1.0, torch.zeros_like(need), need)  # M = 0 removes everything
    need = torch.where(total > 0, need, torch.zeros_like(need)).clamp_min(1)  # [T]
    bounded = ~torch.isnan(max_error.float()) & (budget >= 0)  # [T]
    return torch.where(bounded, torch.minimum(need, budget), budget)
