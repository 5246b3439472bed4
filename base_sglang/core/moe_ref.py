"""Reference MoE expert computation over (token, expert) pairs, skipping dropped slots.

Weight layout as transformers 5 stores Qwen3-MoE / Qwen2-MoE / OLMoE / Mixtral experts:
  gate_up [E, 2I, H]  (gate rows first, then up rows)    down [E, H, I]
Shape legend: T tokens, K slots, E experts, H hidden, I expert intermediate size.
This is the CPU path of the native engine and the oracle for the fused Triton MoE kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def expert_outputs(hidden: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, act: Callable = F.silu) -> torch.Tensor:
    """Unweighted E_u(z_t) for every slot. hidden [T, H], ids [T, K] (-1 -> zeros). Returns [T, K, H]."""
    T, K = ids.shape
    out = hidden.new_zeros(T, K, hidden.shape[-1])
    flat = ids.reshape(-1)  # [T*K]
    tok = torch.arange(T, device=ids.device).repeat_interleave(K)  # [T*K]
    for e in torch.unique(flat[flat >= 0]).tolist():  # host sync: reference path only
        sel = (flat == e).nonzero().squeeze(1)  # [n]
        x = hidden[tok[sel]]  # [n, H]
        gate, up = F.linear(x, gate_up[e]).chunk(2, dim=-1)  # [n, I] each
        out.view(T * K, -1)[sel] = F.linear(act(gate) * up, down[e]).to(out.dtype)  # [n, H]
    return out


def moe_forward_ref(hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    gate_up: torch.Tensor, down: torch.Tensor, act: Callable = F.silu) -> torch.Tensor:
    """y_t = sum_k weights[t,k] * E_{ids[t,k]}(hidden[t]); slots with id -1 contribute nothing.

    hidden [T, H], ids [T, K], weights [T, K]. Returns [T, H] in hidden's dtype. An expert that no
    slot selects is never touched (its weights may be NaN).
    """
    outs = expert_outputs(hidden, ids, gate_up, down, act)  # [T, K, H]
    w = torch.where(ids >= 0, weights, torch.zeros_like(weights)).to(outs.dtype)  # [T, K]
    return (outs * w.unsqueeze(-1)).sum(1)  # [T, H]


def expert_output_norms(hidden: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                        down: torch.Tensor, act: Callable = F.silu) -> torch.Tensor:
    """||E_{ids[t,k]}(hidden[t])||_2 in fp32, [T, K] (the oracle policy's routed_norms)."""
    return expert_outputs(hidden, ids, gate_up, down, act).float().norm(dim=-1)
