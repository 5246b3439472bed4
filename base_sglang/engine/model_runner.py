"""Runs the transformers model for a prefill batch (dense) or a decode batch (BASE selection)."""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from ..core import Predictor, SelectionConfig
from ..hf import MoEPatch, decode_step, load_model, resolve_device, resolve_dtype
from .config import EngineConfig
from .kv_cache import BatchKVCache
from .sampler import token_logprobs
from .sequence import Sequence
from .stats import StepStats


class ModelRunner:
    def __init__(self, config: EngineConfig):
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model, self.tokenizer = load_model(config.model, self.device, self.dtype)
        predictor = None
        if config.predictor_path is not None:
            predictor = Predictor.load(config.predictor_path, device=self.device)
        selection = SelectionConfig(policy=config.policy)
        if selection.needs_stats is not None and predictor is None:
            raise ValueError(f"predictor: policy {config.policy!r} needs a predictor file; none at "
                             f"{config.model}/predictor.safetensors (pass --predictor or --policy)")
        if predictor is not None:
            predictor.check_stats(config.policy, selection.needs_stats, str(config.predictor_path))
        self.predictor = predictor
        self.patch = MoEPatch(self.model, selection, predictor)
        self.num_experts = self.patch.num_experts
        self.moe_layers = sorted(self.patch.blocks)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.kv = BatchKVCache()

    def run(self, seqs: list[Sequence], is_prefill: bool) -> tuple[torch.Tensor, StepStats]:
        """Forward one batch; returns last-position logits [B, V] and the step's statistics."""
        t0 = time.perf_counter()
        if is_prefill:
            logits = self.prefill(seqs)
            stats = StepStats(True, len(seqs), sum(len(s.prompt_ids) for s in seqs if s is s.group[0]),
                              time.perf_counter() - t0)
            return logits, stats
        logits, step = self.decode(seqs)
        return logits, self._decode_stats(seqs, step, time.perf_counter() - t0)

    @torch.inference_mode()
    def prefill(self, seqs: list[Sequence]) -> torch.Tensor:
        """Dense forward of the new prompts, left-padded, each once (a request's n choices share
        it); their KV rows join the batch cache, one per sequence. Returns logits [len(seqs), V]."""
        firsts = [s for s in seqs if s is s.group[0]]
        L = max(len(s.prompt_ids) for s in firsts)
        pads = [L - len(s.prompt_ids) for s in firsts]
        ids = torch.tensor([[self.pad_id] * p + s.prompt_ids for p, s in zip(pads, firsts)],
                           device=self.device)  # [b, L]
        mask = (torch.arange(L, device=self.device)[None, :]
                >= torch.tensor(pads, device=self.device)[:, None]).long()  # [b, L]
        pos = (mask.cumsum(-1) - 1).clamp_min(0)  # [b, L]
        want_prompt = any(s.params.prompt_logprobs is not None for s in firsts)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                         past_key_values=DynamicCache(), use_cache=True,
                         logits_to_keep=0 if want_prompt else 1)
        for b, first in enumerate(firsts):
            if first.params.prompt_logprobs is not None:
                lps = [None] + token_logprobs(out.logits[b, pads[b]:L - 1], first.prompt_ids[1:],
                                              first.params.prompt_logprobs)
                for seq in first.group:
                    seq.prompt_logprobs = lps
        row_of = {id(s): b for b, s in enumerate(firsts)}
        rows = [row_of[id(s.group[0])] for s in seqs]  # [len(seqs)] prefilled row of each sequence
        self.kv.merge(out.past_key_values, pads, rows)
        return out.logits[rows, -1]  # [len(seqs), V]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]):
        """One token per running request, every MoE layer under its batch's budgets."""
        assert len(seqs) == self.kv.num_rows, "running requests and KV rows out of step"
        ids = torch.tensor([[s.last_token] for s in seqs], device=self.device)  # [B, 1]
        pos = torch.tensor([[s.num_tokens - 1] for s in seqs], device=self.device)  # [B, 1]
        budget = torch.tensor([s.budget for s in seqs], device=self.device)  # [B]
        noop, max_error = self._step_budgets(seqs)
        mask = self.kv.attention_mask(1, self.device)  # [B, S + 1]
        self.kv.snapshot()
        try:
            top = max(s.budget for s in seqs)  # a tile hint for the CUDA expert kernel
            bound = top if 0 < top < self.num_experts else None
            with decode_step(budget, skip_selection=noop, max_error=max_error,
                             max_experts=bound) as step:
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                 past_key_values=self.kv.cache, use_cache=True, logits_to_keep=1)
        except BaseException:
            self.kv.restore()
            raise
        return out.logits[:, -1], step  # [B, V]

    def _step_budgets(self, seqs: list[Sequence]) -> tuple[bool, torch.Tensor | None]:
        """(skip_selection, max_error [B] or None) of a decode batch.

        The step runs the largest request, so the kept set is the whole union when an unbounded
        row's budget reaches E or every routed pair (B * K); a bounded row's budget is only its
        cap (its M is picked per layer on the device), so it never implies that. The per-row
        bounds (NaN = none) go to the core only when some row has one and the step selects.
        """
        full = min(self.num_experts, len(seqs) * self.patch.top_k)
        noop = max((s.budget for s in seqs if s.max_error is None), default=0) >= full
        if noop or all(s.max_error is None for s in seqs):
            return noop, None
        bounds = [float("nan") if s.max_error is None else s.max_error for s in seqs]
        return False, torch.tensor(bounds, device=self.device)  # [B]

    def release(self, rows: list[int]) -> None:
        self.kv.release(rows)

    def _decode_stats(self, seqs, step, duration: float) -> StepStats:
        E = self.num_experts
        budgets = tuple(min(s.budget, E) for s in seqs)  # a bounded row: its cap
        per_layer = [step.stats[layer] for layer in self.moe_layers if layer in step.stats]
        routed = torch.stack([s.num_union for s in per_layer]).tolist() if per_layer else []
        kept = torch.stack([s.num_kept for s in per_layer]).tolist() if per_layer else []
        removed = float(sum(s.removed_cost for s in per_layer)) if per_layer else 0.0
        return StepStats(False, len(seqs), len(seqs), duration, budgets, max(budgets),
                         tuple(routed), tuple(kept), removed)
