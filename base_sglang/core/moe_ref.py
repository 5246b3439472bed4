"""Reference MoE expert computation over (token, expert) pairs, skipping dropped slots.

Weight layout as transformers 5 stores Qwen3-MoE / Qwen2-MoE / OLMoE / Mixtral / DeepSeek-V2 experts:
  gate_up [E, 2I, H]  (gate rows first, then up rows)    down [E, H, I]
Shape legend: T tokens, K slots, E experts, H hidden, I expert intermediate size.
This is the native engine's CPU expert path, the calibration's expert path (fp32), and the oracle
for the fused Triton MoE kernel. It is the only expert forward in the project.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def run_expert(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
               act: Callable = F.silu) -> torch.Tensor:
    """E(x) for one expert. x [n, H], gate_up [2I, H], down [H, I] (same dtype) -> [n, H]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)  # [n, I] each
    return F.linear(act(gate) * up, down)  # [n, H]


def expert_outputs(hidden: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, act: Callable = F.silu,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """Unweighted E_{ids[t,k]}(hidden[t]) for every slot, [T, K, H] in `dtype` (default: hidden's).

    ids [T, K] (-1 -> zeros, never computed). With dtype set, each expert's weights are cast to it
    one expert at a time (memory stays bounded; calibration uses float32).
    """
    T, K = ids.shape
    dtype = dtype or hidden.dtype
    x_all = hidden.to(dtype)
    out = torch.zeros(T * K, hidden.shape[-1], dtype=dtype, device=hidden.device)  # [T*K, H]
    flat = ids.reshape(-1)  # [T*K]
    tok = torch.arange(T, device=ids.device).repeat_interleave(K)  # [T*K]
    for e in torch.unique(flat[flat >= 0]).tolist():  # host sync: reference path only
        sel = (flat == e).nonzero().squeeze(1)  # [n]
        out[sel] = run_expert(x_all[tok[sel]], gate_up[e].to(dtype), down[e].to(dtype), act)
    return out.view(T, K, -1)


def all_expert_outputs(hidden: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                       act: Callable = F.silu) -> torch.Tensor:
    """Every expert on every token, fp32 [E, T, H] (one linear + one batched matmul). hidden [T, H]."""
    E, I2, H = gate_up.shape
    h = F.linear(hidden.float(), gate_up.float().reshape(E * I2, H))  # [T, E*2I]
    gate, up = h.view(-1, E, I2).transpose(0, 1).chunk(2, dim=-1)  # [E, T, I] each
    return torch.bmm(act(gate) * up, down.float().transpose(1, 2))  # [E, T, H]


def routed_outputs(hidden: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor, act: Callable = F.silu, dense_tokens: int = 64):
    """expert_outputs in fp32 [T, K, H]; ids must be real (no -1).

    Up to dense_tokens tokens (a decode step) every expert runs on every token in two batched matmuls
    and the routed slots are gathered; larger batches loop over the experts present.
    """
    T = ids.shape[0]
    if T <= dense_tokens:
        outs = all_expert_outputs(hidden, gate_up, down, act)  # [E, T, H]
        return outs[ids.long(), torch.arange(T, device=hidden.device)[:, None]]  # [T, K, H]
    return expert_outputs(hidden, ids.long(), gate_up, down, act, dtype=torch.float32)


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
