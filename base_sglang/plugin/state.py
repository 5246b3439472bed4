"""The plugin's per-process state: predictor, the static budget buffer, the decode gate, counters.

One module-level `STATE` per SGLang process. In the scheduler (= TP worker) process it is filled
after the model loads (`enable`) and the budget buffer is allocated before CUDA-graph capture
(`ensure_buffer`). Each target-model decode forward runs inside `decode_step(budgets)`, which
writes the step's per-token budgets into the buffer (padded rows -1) and opens the gate that
the TopK hook checks; decode-graph capture runs inside `capture()`, so the graphs read the buffer.

Shape legend: N buffer rows (>= any decode batch, incl. graph padding), L MoE layers.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from base_sglang.core import DEFAULT_POLICY, Predictor, SelectionConfig, select_experts
from base_sglang.core.budget import resolve_budget

from .config import PluginConfig
from .selection_trace import SelectionTrace

log = logging.getLogger("base_sglang.plugin")


@dataclass
class PluginState:
    config: PluginConfig = field(default_factory=PluginConfig)
    config_error: str | None = None  # a bad BASE_* variable, raised at startup by the hooks
    predictor: Predictor | None = None  # on the model's device; None = BASE off in this process
    selection: SelectionConfig = field(default_factory=lambda: SelectionConfig(policy=DEFAULT_POLICY))
    num_experts: int = 0
    default_budget: int = 0  # budget of requests that set none, 1..E (E = dense)
    select: Callable = select_experts  # core, or base_sglang.kernels.base_select_experts
    budget: torch.Tensor | None = None  # [N] int32 on the model's device, -1 = padded row
    active: bool = False  # inside a target-model decode forward (or decode-graph capture)
    num_kept: torch.Tensor | None = None  # [L] int64 distinct experts executed, summed over steps
    num_union: torch.Tensor | None = None  # [L] int64 distinct experts routed, summed over steps
    num_steps: int = 0  # decode forwards since the last stats line
    trace_path: str | None = None  # BASE_STEP_TRACE: one JSON line per decode step (checks only)
    sel_trace: SelectionTrace | None = None  # BASE_SELECTION_TRACE: per-rank digests (TP checks)
    sglang_moe_reasons: set = field(default_factory=set)  # why calls ran SGLang's MoE (logged once)

    @property
    def enabled(self) -> bool:
        return self.predictor is not None

    def enable(self, predictor: Predictor, config: PluginConfig, device: torch.device | str) -> None:
        self.config = config
        self.predictor = predictor.to(device)
        self.selection = SelectionConfig(policy=config.policy)
        self.num_experts = predictor.meta.num_experts
        self.default_budget = resolve_budget(config.default_budget, "BASE_DEFAULT_BUDGET",
                                             self.num_experts)
        self.select = _select_fn(config, device)
        num_layers = len(predictor.meta.moe_layers)
        self.num_kept = torch.zeros(num_layers, dtype=torch.int64, device=device)
        self.num_union = torch.zeros(num_layers, dtype=torch.int64, device=device)
        self.trace_path = os.environ.get("BASE_STEP_TRACE") or None
        self.sel_trace = SelectionTrace.from_env(num_layers)

    def ensure_buffer(self, rows: int, device: torch.device | str) -> None:
        """Allocate (or grow, before capture only) the budget buffer to at least `rows` rows."""
        if self.budget is None or self.budget.numel() < rows:
            self.budget = torch.full((rows,), -1, dtype=torch.int32, device=device)  # [N]

    def fill(self, budgets: list[int]) -> bool:
        """Write one decode step's budgets; rows past them become padding. False if they don't fit."""
        n = len(budgets)
        if self.budget is None or n > self.budget.numel():
            log.warning("BASE: decode batch of %d rows exceeds the budget buffer; step runs dense", n)
            return False
        host = torch.tensor([min(b, self.num_experts) for b in budgets], dtype=torch.int32)  # [n]
        self.budget[:n].copy_(host, non_blocking=True)  # stream-ordered with the forward
        self.budget[n:].fill_(-1)
        return True

    @contextmanager
    def decode_step(self, budgets: list[int]):
        """Run one target-model decode forward under BASE with these per-token budgets."""
        ok = self.enabled and self.fill(budgets)
        self.active = ok
        if ok and self.sel_trace is not None:
            self.sel_trace.begin_step()
        try:
            yield ok
        finally:
            self.active = False
        if ok:
            self.num_steps += 1
            if self.sel_trace is not None:
                self.sel_trace.end_step(budgets)
            if self.trace_path:
                self.trace_step(budgets)
            self.maybe_log_stats()

    def trace_step(self, budgets: list[int]) -> None:
        """Append this step's per-layer counts to BASE_STEP_TRACE, then restart the counters.

        A host sync per step: for checks (benchmarks/gpu/check_proxy_sglang.py), not serving."""
        rec = {"rows": len(budgets), "max_budget": max(budgets, default=0),
               "kept": self.num_kept.tolist(), "union": self.num_union.tolist()}  # [L] each
        with open(self.trace_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.num_kept.zero_()
        self.num_union.zero_()
        self.num_steps = 0

    @contextmanager
    def capture(self):
        """Decode-graph capture: the captured graphs read the buffer that `fill` writes later."""
        self.active = self.enabled
        try:
            yield
        finally:
            self.active = False
            if self.enabled:
                self.budget.fill_(-1)
                self.num_kept.zero_()
                self.num_union.zero_()

    def note_sglang_moe(self, reason: str) -> None:
        """Log once per reason why a BASE step's MoE call runs SGLang's kernel, not ours."""
        if reason not in self.sglang_moe_reasons:
            self.sglang_moe_reasons.add(reason)
            log.info("BASE: SGLang's fused MoE runs this call (%s)", reason)

    def record(self, slot: int, num_union: torch.Tensor, num_kept: torch.Tensor) -> None:
        """In-graph counter update (no host sync): per-layer sums over decode steps."""
        self.num_union[slot] += num_union
        self.num_kept[slot] += num_kept

    def maybe_log_stats(self) -> None:
        every = self.config.stats_interval
        if every == 0 or self.num_steps < every:
            return
        kept = self.num_kept.cpu().double() / self.num_steps  # [L] one host sync per interval
        union = self.num_union.cpu().double() / self.num_steps  # [L]
        log.info("BASE: %d decode steps, experts executed per MoE layer per step: mean %.2f "
                 "(dense union %.2f), per layer %s", self.num_steps, kept.mean().item(),
                 union.mean().item(), [round(x, 2) for x in kept.tolist()])
        self.num_kept.zero_()
        self.num_union.zero_()
        self.num_steps = 0


def _select_fn(config: PluginConfig, device) -> Callable:
    """The Triton launcher on CUDA when importable (same semantics as the core), else the core."""
    if not config.kernels or torch.device(device).type != "cuda":
        return select_experts
    try:
        from base_sglang.kernels import base_select_experts
    except ImportError as exc:  # no triton in this environment
        log.warning("BASE: Triton kernels unavailable (%s); using the torch core", exc)
        return select_experts
    return base_select_experts


STATE = PluginState()


def reset() -> None:
    """Fresh state (tests)."""
    global STATE
    STATE.__init__()
