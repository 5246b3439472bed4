"""Per-layer routing statistics of a top-k MoE router, from router logits (N, E) per layer."""

from __future__ import annotations

import math

import torch


def _entropy(p: torch.Tensor) -> torch.Tensor:
    p = p / p.sum(-1, keepdim=True)
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


class RoutingAccumulator:
    """Sums over tokens: top-k assignment counts (overall and per token group), mean router
    probabilities and per-token router entropy."""

    def __init__(self, n_layers: int, n_experts: int, top_k: int, device: torch.device):
        z = lambda *s: torch.zeros(*s, dtype=torch.float64, device=device)
        self.k, self.e = top_k, n_experts
        self.counts = z(n_layers, n_experts)  # assignments per expert
        self.group_counts = z(2, n_layers, n_experts)  # [text, code]
        self.prob_sum = z(n_layers, n_experts)
        self.ent_sum = z(n_layers)
        self.n = 0

    @torch.no_grad()
    def add(self, router_logits: tuple[torch.Tensor, ...], group: torch.Tensor | None = None) -> None:
        """router_logits: per layer (N, E); group: (N,) bool, True for code tokens."""
        for layer, logits in enumerate(router_logits):
            probs = logits.float().softmax(-1)  # (N, E)
            top = probs.topk(self.k, dim=-1).indices  # (N, k)
            hit = torch.zeros_like(probs).scatter_(1, top, 1.0)  # (N, E)
            self.counts[layer] += hit.sum(0).double()
            if group is not None:
                self.group_counts[1, layer] += hit[group].sum(0).double()
                self.group_counts[0, layer] += hit[~group].sum(0).double()
            self.prob_sum[layer] += probs.sum(0).double()
            self.ent_sum[layer] += _entropy(probs).sum().double()
        self.n += router_logits[0].shape[0]

    def summary(self) -> dict:
        layers = []
        for i in range(self.counts.shape[0]):
            load = self.counts[i] / self.counts[i].mean()  # 1.0 = balanced
            g = self.group_counts[:, i]
            tv = None
            if g[0].sum() > 0 and g[1].sum() > 0:
                tv = 0.5 * (g[0] / g[0].sum() - g[1] / g[1].sum()).abs().sum().item()
            layers.append({
                "load_max_over_mean": load.max().item(),
                "load_min_over_mean": load.min().item(),
                "dead_experts": int((load < 0.1).sum().item()),
                "load_entropy": (_entropy(self.counts[i]) / math.log(self.e)).item(),
                "mutual_info": (_entropy(self.prob_sum[i]) - self.ent_sum[i] / self.n).item(),
                "code_text_tv": tv,
                "load": [round(x, 4) for x in load.tolist()],
            })
        return {"tokens": self.n, "top_k": self.k, "num_experts": self.e, "layers": layers}


@torch.no_grad()
def union_curve(router_logits: tuple[torch.Tensor, ...], n_docs: int, length: int, top_k: int,
                batch_sizes: tuple[int, ...]) -> dict:
    """Mean number of distinct experts routed at one position by B different documents, per layer.
    router_logits: per layer (n_docs * length, E), documents in row-major order."""
    e = router_logits[0].shape[-1]
    per_layer = {b: [] for b in batch_sizes}
    for logits in router_logits:
        top = logits.float().topk(top_k, dim=-1).indices.view(n_docs, length, top_k)  # (D, L, k)
        for b in batch_sizes:
            idx = top[:b].permute(1, 0, 2).reshape(length, b * top_k)  # (L, b*k)
            mask = torch.zeros(length, e, device=logits.device).scatter_(1, idx, 1.0)
            per_layer[b].append(mask.sum(1).mean().item())
    return {
        "batch_sizes": list(batch_sizes), "doc_tokens": length, "per_layer": per_layer,
        "mean": {b: sum(v) / len(v) for b, v in per_layer.items()},
        "uniform": {b: e * (1 - (1 - top_k / e) ** b) for b in batch_sizes},
    }
