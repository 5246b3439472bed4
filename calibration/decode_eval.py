"""Batched teacher-forced decoding of one batch under one selection setting.

B windows from different documents are prefilled densely for `prefix` tokens (one forward, DynamicCache),
then advance one token per step together: step s feeds the true token at position prefix+s under
`decode_step` (so every MoE layer sees a genuine B-row decode batch) and scores the prediction of
token prefix+s+1. The dense run of the same batch is the reference for agreement and KL.

Shape legend: B rows, V vocabulary, K routed slots, E experts, T = B tokens per decode step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from base_sglang.core import SelectionConfig
from base_sglang.hf import MoEPatch, decode_step
from base_sglang.hf.blocks import routed_outputs


@dataclass
class Setting:
    """One point of the sweep: a policy, its knobs, and the per-row budget it runs with."""

    name: str
    policy: str
    knob: str  # e.g. "M", "k0", "S/rho"
    value: float | str
    config: SelectionConfig
    budget: int  # per-row budget handed to decode_step (M, D, or E = no batch budget)
    max_error: float | None = None  # per-row predicted-error bound (error-targeted budgets)


@dataclass
class Trace:
    """What one (setting, batch) run produced. Per-step tensors are [steps, B]."""

    logp_target: torch.Tensor  # log p(true next token)
    argmax: torch.Tensor  # predicted token
    logp: torch.Tensor | None = None  # [steps, B, V] (kept for the dense reference only)
    kl: torch.Tensor | None = None  # [steps, B] KL(dense || policy)
    kept: list[float] = field(default_factory=list)  # experts executed, per (step, layer)
    union: list[float] = field(default_factory=list)  # experts routed, per (step, layer)
    energy: list[float] = field(default_factory=list)  # retained removal energy, per (step, layer)


class EnergyProbe:
    """Forward hooks on every router that measure, on the policy's own trajectory, the share of true
    removal energy sum_t sum_{u in R_t} w^2 ||E_u(z_t)||^2 that falls on experts the step executed."""

    def __init__(self, patch: MoEPatch):
        self.patch = patch
        self.values: list[float] = []
        self.active = False
        self.handles = [b.gate.register_forward_hook(self._hook(b)) for b in patch.blocks.values()]

    def _hook(self, block: nn.Module):
        E = self.patch.num_experts

        def hook(module, args, output):
            if not self.active:
                return None
            x = args[0].reshape(-1, args[0].shape[-1])  # [T, H]
            _, w, ids = type(module).forward(module, x)  # the model's own routing (unpatched)
            ids = ids.reshape(x.shape[0], -1).long()  # [T, K]
            c = w.reshape(ids.shape).float().square() * routed_outputs(x, ids, block.experts).norm(
                dim=-1).square()  # [T, K] true removal cost
            executed = output[2].reshape(-1).long()  # executed ids, -1 = dropped slot
            kept = torch.zeros(E, dtype=torch.bool, device=x.device)
            kept[executed[executed >= 0]] = True
            self.values.append(float((c * kept[ids]).sum() / c.sum().clamp_min(1e-30)))
            return None

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def run_batch(model: nn.Module, patch: MoEPatch, tokens: torch.Tensor, prefix: int, steps: int,
              setting: Setting, probe: EnergyProbe | None = None,
              ref_logp: torch.Tensor | None = None, keep_logp: bool = False) -> Trace:
    """tokens [B, prefix + steps + 1]; ref_logp [steps, B, V] = the dense run's log-probs (for KL)."""
    from transformers import DynamicCache

    B = tokens.shape[0]
    patch.set_config(setting.config)
    budget = torch.full((B,), setting.budget, dtype=torch.long, device=tokens.device)  # [B]
    max_error = None if setting.max_error is None else torch.full(
        (B,), float(setting.max_error), device=tokens.device)  # [B]
    lp_t, am, lps, kls = [], [], [], []
    trace = Trace(torch.empty(0), torch.empty(0))
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=tokens[:, :prefix], past_key_values=cache, use_cache=True)  # dense prefill
        for s in range(steps):
            tok = tokens[:, prefix + s:prefix + s + 1]  # [B, 1]
            if probe is not None:
                probe.active = True
            with decode_step(budget, max_error=max_error) as st:
                logits = model(input_ids=tok, past_key_values=cache, use_cache=True).logits
            if probe is not None:
                probe.active = False
            for layer in sorted(st.stats):
                trace.kept.append(float(st.stats[layer].num_kept))
                trace.union.append(float(st.stats[layer].num_union))
            logp = F.log_softmax(logits[:, -1].float(), dim=-1)  # [B, V]
            target = tokens[:, prefix + s + 1]  # [B]
            lp_t.append(logp.gather(1, target[:, None]).squeeze(1))  # [B]
            am.append(logp.argmax(-1))  # [B]
            if ref_logp is not None:
                ref = ref_logp[s]  # [B, V]
                kls.append((ref.exp() * (ref - logp)).sum(-1))  # [B] KL(dense || policy)
            if keep_logp:
                lps.append(logp)
    trace.logp_target = torch.stack(lp_t)  # [steps, B]
    trace.argmax = torch.stack(am)  # [steps, B]
    if kls:
        trace.kl = torch.stack(kls)  # [steps, B]
    if keep_logp:
        trace.logp = torch.stack(lps)  # [steps, B, V]
    if probe is not None:
        trace.energy, probe.values = probe.values, []
    return trace
