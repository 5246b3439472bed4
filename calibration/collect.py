"""Capture MoE-layer inputs and routed expert outputs with hooks, and fold them into fp64 statistics.

Shape legend: T tokens in the forward batch, K routed slots, E experts, H hidden size.

A forward hook on each MoE block's router (`block.gate`, the real transformers module) sees the layer
input z [T, H] and the routing (logits, weights, ids). The routed experts' unweighted outputs E_u(z_t)
are recomputed from the block's own weights by core/moe_ref.py (the project's one expert forward),
in fp32, and immediately folded into LayerStats; nothing per
token is kept, so memory is bounded by the statistics, not by the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager

import torch
from torch import nn

from base_sglang.hf.blocks import all_expert_outputs, routed_outputs

LOG_EPS = 1e-6  # target is log(||E_u(z)|| + LOG_EPS)


class StopForward(Exception):
    """Raised by the hook after the last layer a pass needs: the rest of the model is skipped."""


@contextmanager
def capture(blocks: dict[int, nn.Module], layers: Iterable[int],
            fn: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, nn.Module], None]):
    """Call fn(layer, z [T,H], logits [T,E], weights [T,K], ids [T,K], experts) on each router call
    of the given layers; raise StopForward after the last of them."""
    layers = sorted(layers)
    last = layers[-1]
    handles = []

    def make(layer_id: int, block: nn.Module):
        def hook(module, args, output):
            x = args[0] if args else None
            logits, weights, ids = output
            x = x.reshape(-1, x.shape[-1])  # [T, H]
            fn(layer_id, x.detach(), logits.detach().reshape(x.shape[0], -1),
               weights.detach().reshape(x.shape[0], -1), ids.detach().reshape(x.shape[0], -1),
               block.experts)
            if layer_id == last:
                raise StopForward

        return hook

    try:
        for layer_id in layers:
            handles.append(blocks[layer_id].gate.register_forward_hook(make(layer_id, blocks[layer_id])))
        yield
    finally:
        for h in handles:
            h.remove()


def run_forward(model: nn.Module, input_ids: torch.Tensor) -> None:
    """Forward the decoder stack (no LM head); StopForward ends it early."""
    body = getattr(model, "model", model)
    try:
        with torch.no_grad():
            body(input_ids=input_ids, use_cache=False)
    except StopForward:
        pass


class LayerStats:
    """Sufficient statistics of one MoE layer, fp64.

    Ridge (per expert, rows = calibration tokens routed to it, z_aug = [z, 1]):
      zz [E, H+1, H+1] = sum z_aug z_aug^T    zy [E, H+1] = sum z_aug y    yy [E], n [E]
      with y = log(||E_u(z)|| + 1e-6).
    Frequency and ExFold's h_e: count [E] routed slots, norm_sum [E] of unweighted output norms.
    ExFold (ordered co-routed pairs s -> t on one token, u = E_s, v = E_t, omega = ||u||):
      ex_uv [E, E] = sum omega <u, v>   ex_vv = sum omega |v|^2   ex_uu = sum omega |u|^2   ex_n = pairs
    SERE (every expert on the first sere_tokens tokens): gram [E, E] = sum_t <E_e(z_t), E_f(z_t)>.
    """

    def __init__(self, num_experts: int, hidden: int, sere_tokens: int, device="cpu",
                 weight_power: float = 0.0):
        E, H = num_experts, hidden
        f64 = dict(dtype=torch.float64, device=device)
        self.E, self.H = E, H
        self.zz = torch.zeros(E, H + 1, H + 1, **f64)
        self.zy = torch.zeros(E, H + 1, **f64)
        self.yy = torch.zeros(E, **f64)
        self.n = torch.zeros(E, **f64)
        self.count = torch.zeros(E, **f64)
        self.norm_sum = torch.zeros(E, **f64)
        self.ex_uv = torch.zeros(E, E, **f64)
        self.ex_vv = torch.zeros(E, E, **f64)
        self.ex_uu = torch.zeros(E, E, **f64)
        self.ex_n = torch.zeros(E, E, **f64)
        self.gram = torch.zeros(E, E, **f64)
        self.sere_left = sere_tokens
        self.sere_seen = 0
        self.weight_power = weight_power  # ridge rows weighted by w^power (0 = unweighted)

    @staticmethod
    def nbytes(num_experts: int, hidden: int) -> int:
        return 8 * num_experts * ((hidden + 1) ** 2 + hidden + 1 + 6 * num_experts + 4)

    def update(self, x: torch.Tensor, ids: torch.Tensor, experts: nn.Module,
               weights: torch.Tensor | None = None) -> None:
        """x [T, H] layer input, ids [T, K] routed experts, weights [T, K] combine weights (used only
        when weight_power != 0)."""
        T, K = ids.shape
        E = self.E
        ids = ids.long()
        outs = routed_outputs(x, ids, experts)  # [T, K, H] fp32
        norms = outs.norm(dim=-1).double()  # [T, K]
        y = torch.log(norms + LOG_EPS)  # [T, K]
        z = torch.cat([x.double(), x.new_ones(T, 1, dtype=torch.float64)], 1)  # [T, H+1]
        flat = ids.reshape(-1)  # [T*K]
        tok = torch.arange(T, device=x.device).repeat_interleave(K)  # [T*K]
        yf = y.reshape(-1)  # [T*K]
        rho = None
        if self.weight_power and weights is not None:
            rho = weights.double().reshape(-1).pow(self.weight_power)  # [T*K] row weights
        for e in torch.unique(flat).tolist():
            sel = (flat == e).nonzero().squeeze(1)  # [n]
            ze = z[tok[sel]]  # [n, H+1]
            ye = yf[sel]  # [n]
            zw = ze if rho is None else ze * rho[sel, None]  # [n, H+1]
            self.zz[e] += zw.T @ ze
            self.zy[e] += zw.T @ ye
            self.yy[e] += (ye.square() if rho is None else rho[sel] * ye.square()).sum()
            self.n[e] += sel.numel() if rho is None else rho[sel].sum()
        self.count += torch.bincount(flat, minlength=E).double()
        self.norm_sum.index_add_(0, flat, norms.reshape(-1))
        self._exfold(outs, norms, ids)
        if self.sere_left > 0:
            take = min(self.sere_left, T)
            self._sere(x[:take], experts)
            self.sere_left -= take
            self.sere_seen += take

    def _exfold(self, outs: torch.Tensor, norms: torch.Tensor, ids: torch.Tensor) -> None:
        T, K, _ = outs.shape
        E = self.E
        gram = torch.einsum("tkh,tjh->tkj", outs, outs).double()  # [T, K, K] <E_k, E_j>
        sq = gram.diagonal(dim1=1, dim2=2)  # [T, K] |E_k|^2
        omega = norms[:, :, None].expand(T, K, K)  # [T, K(s), K(t)] weight of the source
        off = ~torch.eye(K, dtype=torch.bool, device=outs.device).expand(T, K, K)  # s != t slots
        pair = (ids[:, :, None] * E + ids[:, None, :])[off]  # [T*K*(K-1)] flat (s, t)
        self.ex_uv.view(-1).index_add_(0, pair, (omega * gram)[off])
        self.ex_vv.view(-1).index_add_(0, pair, (omega * sq[:, None, :].expand(T, K, K))[off])
        self.ex_uu.view(-1).index_add_(0, pair, (omega * sq[:, :, None].expand(T, K, K))[off])
        self.ex_n.view(-1).index_add_(0, pair, torch.ones_like(pair, dtype=torch.float64))

    def _sere(self, x: torch.Tensor, experts: nn.Module, chunk: int = 256) -> None:
        for i in range(0, x.shape[0], chunk):
            o = all_expert_outputs(x[i:i + chunk], experts)  # [E, c, H]
            o = o.reshape(self.E, -1).double()  # [E, c*H]
            self.gram += o @ o.T
