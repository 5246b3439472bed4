"""A per-expert low-rank sketch of the expert itself, evaluated as a feature of its output norm.

An expert is E_u(z) = W_d (act(W_g z) * (W_u z)) = sum_j h_j(z) d_j with d_j = W_d[:, j]
(core/moe_ref.py layout: gate_up [E, 2I, H], gate rows first; down [E, H, I]). Stack W = [W_g; W_u]
[2I, H] and replace it by a rank-r factorisation W ~ A_r B_r (A_r [2I, r], B_r [r, H]). Per routed pair:
  s = B_r z                  (rH MACs)
  [g~; u~] = A_r s           (2Ir MACs)
  h~ = act(g~) * u~          (I)
  energy   Q~(z) = sum_j h~_j^2 ||d_j||^2   (I MACs; ||d_j||^2 stored)
  out      O~(z) = ||W_d h~||               (HI MACs; the full down product)
The features are log(Q~ + eps^2) and log(O~ + eps). Two ways to pick the factors (sketch_factors):
  "svd"   truncated SVD of W: B_r = the top-r right singular vectors, A_r = U_r S_r; the best rank-r W
          in Frobenius norm (every direction of z weighted alike);
  "data"  the top-r directions of the expert's pre-activations P = X W^T on the fit rows X routed to u:
          V_r [2I, r] = top-r right singular vectors of P, A_r = V_r, B_r = V_r^T W; then X B_r^T A_r^T =
          P V_r V_r^T is the best rank-r approximation of P itself (an expert no fit row routes to falls
          back to "svd").
At full rank r = min(2I, H) both are W exactly, so the energy feature is log(sum_j h_j^2 ||d_j||^2 + eps^2)
and the out feature is log(||E_u(z)|| + eps).

Shape legend: T tokens, K routed slots, E experts, H hidden, I expert intermediate, r sketch rank,
n rows of one expert.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SKETCH_EPS = 1e-6  # features are log(Q~ + eps^2) and log(O~ + eps)
SKETCH_METHODS = ("svd", "data")


def max_rank(gate_up: torch.Tensor) -> int:
    """min(2I, H): the rank of an exact sketch. gate_up [E, 2I, H]."""
    return min(gate_up.shape[1], gate_up.shape[2])


def _check_rank(r: int, gate_up: torch.Tensor) -> None:
    if not 1 <= r <= max_rank(gate_up):
        raise ValueError(f"sketch: r must be in 1..{max_rank(gate_up)} (min(2I, H) of the expert), "
                         f"got {r}")


def _pairs(ids: torch.Tensor):
    """Flat expert id [T*K] and token index [T*K] of every routed slot."""
    T, K = ids.shape
    return ids.reshape(-1).long(), torch.arange(T, device=ids.device).repeat_interleave(K)


def svd_factors(gate_up: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [E, 2I, r], B [E, r, H]) of the truncated SVD W ~ A B of every expert's [W_g; W_u]."""
    _check_rank(r, gate_up)
    U, S, Vh = torch.linalg.svd(gate_up.float(), full_matrices=False)  # [E,2I,k], [E,k], [E,k,H]
    return U[..., :r] * S[:, None, :r], Vh[:, :r].contiguous()


def data_factors(z: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                 r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [E, 2I, r], B [E, r, H]): per expert the top-r directions of its pre-activations on the rows
    routed to it (A = V_r orthonormal, B = V_r^T W); experts no row routes to keep svd_factors.
    z [T, H], ids [T, K], gate_up [E, 2I, H]."""
    A, B = svd_factors(gate_up, r)
    flat, tok = _pairs(ids)
    for u in torch.unique(flat).tolist():
        w = gate_up[u].float()  # [2I, H]
        p = z[tok[flat == u]].float() @ w.T  # [n, 2I] pre-activations
        v = torch.linalg.svd(p, full_matrices=False).Vh[:r].T  # [2I, r'] (r' = min(r, n))
        if v.shape[1] < r:  # fewer rows than r: complete the basis from W's own directions
            rest = A[u] - v @ (v.T @ A[u])  # [2I, r]
            v = torch.cat([v, torch.linalg.qr(rest).Q[:, :r - v.shape[1]]], 1)
        A[u], B[u] = v, v.T @ w
    return A, B


def sketch_factors(gate_up: torch.Tensor, r: int, method: str = "svd", z: torch.Tensor | None = None,
                   ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(A [E, 2I, r], B [E, r, H]) by method "svd" or "data" (the latter needs the fit rows z, ids)."""
    if method not in SKETCH_METHODS:
        raise ValueError(f"sketch: method must be one of {SKETCH_METHODS}, got {method!r}")
    return svd_factors(gate_up, r) if method == "svd" else data_factors(z, ids, gate_up, r)


def sketch_hidden(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, act: Callable) -> torch.Tensor:
    """h~ [n, I] of one expert's sketch. x [n, H], a [2I, r], b [r, H]."""
    gate, up = ((x @ b.T) @ a.T).chunk(2, dim=-1)  # s = B x [n, r], then A s [n, 2I] -> [n, I] each
    return act(gate) * up


def sketch_features(z: torch.Tensor, ids: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    down: torch.Tensor, act: Callable,
                    out: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log(Q~ + eps^2), log(O~ + eps) or None unless out), each [T, K], for every routed slot.

    z [T, H], ids [T, K], A [E, 2I, r], B [E, r, H], down [E, H, I].
    """
    T, K = ids.shape
    flat, tok = _pairs(ids)
    dn2 = down.float().square().sum(1)  # [E, I] ||d_j||^2
    qn = torch.zeros(T * K)
    on = torch.zeros(T * K) if out else None
    for u in torch.unique(flat).tolist():
        m = (flat == u).nonzero().squeeze(1)  # [n]
        h = sketch_hidden(z[tok[m]].float(), A[u], B[u], act)  # [n, I]
        qn[m] = (h.square() * dn2[u]).sum(1)
        if out:
            on[m] = (h @ down[u].float().T).norm(dim=1)
    return (torch.log(qn + SKETCH_EPS ** 2).view(T, K),
            torch.log(on + SKETCH_EPS).view(T, K) if out else None)
