"""A few of each expert's own neurons, computed exactly, as features of its output norm.

An expert is E_u(z) = W_d (act(W_g z) * (W_u z)) = sum_j h_j(z) d_j with h_j = act(g_j . z) (u_j . z),
d_j = W_d[:, j] (core/moe_ref.py layout: gate_up [E, 2I, H], gate rows first; down [E, H, I]).
For a neuron subset S_u of r indices per expert:
  partial  P_S(z) = sum_{j in S} h_j d_j        (the exact partial output; 2rH + Hr MACs per pair)
  energy   Q_S(z) = sum_{j in S} h_j^2 ||d_j||^2 (no cross terms; 2rH + r MACs per pair)
select_neurons picks S_u on the fit pairs by a rule over c_j = h_j^2 ||d_j||^2 (neuron j's own energy):
  "energy" the r largest mean c_j;  "var" the r largest variance of c_j (what the bias cannot absorb).

Shape legend: T tokens, K routed slots, E experts, H hidden, I expert intermediate, R neurons kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NEURON_EPS = 1e-6  # features are log(||P_S|| + eps) and log(Q_S + eps^2)
NEURON_RULES = ("energy", "var")


def _pairs(ids: torch.Tensor):
    """Flat expert id [T*K] and token index [T*K] of every routed slot."""
    T, K = ids.shape
    return ids.reshape(-1).long(), torch.arange(T, device=ids.device).repeat_interleave(K)


def _hidden(x: torch.Tensor, gate_up: torch.Tensor, act: Callable) -> torch.Tensor:
    """h [n, I'] of one expert's (sub)set of neurons. x [n, H], gate_up [2I', H] (gate rows first)."""
    gate, up = (x @ gate_up.T).chunk(2, dim=-1)  # [n, I'] each
    return act(gate) * up


def select_neurons(z: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   r: int, act: Callable, rule: str = "energy") -> torch.Tensor:
    """S [E, r] long: per expert the r neurons of largest mean (rule "energy") or variance ("var") of
    h_j^2 ||d_j||^2 over its routed rows, in decreasing order (so S[:, :r'] is the rule's choice for any r' <= r). An expert no fit row
    routes to keeps neurons 0..r-1. z [T, H], ids [T, K], gate_up [E, 2I, H], down [E, H, I]."""
    E, I2, _ = gate_up.shape
    if not 1 <= r <= I2 // 2:
        raise ValueError(f"neurons: r must be in 1..{I2 // 2} (the expert's intermediate size), got {r}")
    if rule not in NEURON_RULES:
        raise ValueError(f"neuron_rule: must be one of {NEURON_RULES}, got {rule!r}")
    flat, tok = _pairs(ids)
    sel = torch.arange(r).repeat(E, 1)  # [E, r]
    dn2 = down.float().square().sum(1)  # [E, I] ||d_j||^2
    for u in torch.unique(flat).tolist():
        rows = z[tok[flat == u]].float()  # [n, H]
        h = _hidden(rows, gate_up[u].float(), act)  # [n, I]
        c = h.square() * dn2[u]  # [n, I]
        sel[u] = (c.mean(0) if rule == "energy" else c.var(0, correction=0)).topk(r).indices
    return sel


def neuron_features(z: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                    sel: torch.Tensor, act: Callable) -> tuple[torch.Tensor, torch.Tensor]:
    """(log(||P_S|| + eps), log(Q_S + eps^2)), each [T, K], for every routed slot with S = sel[u].

    z [T, H], ids [T, K], gate_up [E, 2I, H], down [E, H, I], sel [E, R] neuron indices.
    """
    T, K = ids.shape
    I = gate_up.shape[1] // 2  # noqa: E741
    flat, tok = _pairs(ids)
    pn = torch.zeros(T * K)
    qn = torch.zeros(T * K)
    for u in torch.unique(flat).tolist():
        m = (flat == u).nonzero().squeeze(1)  # [n]
        s = sel[u]  # [R]
        rows = torch.cat([s, s + I])  # gate rows of S, then up rows of S
        h = _hidden(z[tok[m]].float(), gate_up[u, rows].float(), act)  # [n, R]
        d = down[u][:, s].float()  # [H, R]
        pn[m] = (h @ d.T).norm(dim=1)
        qn[m] = (h.square() * d.square().sum(0)).sum(1)
    return (torch.log(pn + NEURON_EPS).view(T, K),
            torch.log(qn + NEURON_EPS ** 2).view(T, K))
