"""The native engine: add requests, then step() = schedule -> run -> sample -> postprocess."""

from __future__ import annotations

import itertools
import logging
import traceback
import uuid

import torch

from ..core.budget import BUDGET_FIELD, resolve_budget
from ..hf import eos_token_ids
from ..protocol import RequestOutput
from .config import EngineConfig
from .detokenizer import Detokenizer
from .model_runner import ModelRunner
from .sampler import Sampler, token_logprobs
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats, StepStats

log = logging.getLogger(__name__)
NON_FINITE = ("the model produced non-finite logits (NaN or Inf) for this request; it was "
              "stopped (other requests in the batch are unaffected)")


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.runner = ModelRunner(config)
        self.tokenizer = self.runner.tokenizer
        self.num_experts = self.runner.num_experts
        model_cfg = self.runner.model.config
        self.max_model_len = config.max_model_len or model_cfg.max_position_embeddings
        self.eos_ids = eos_token_ids(self.runner.model, self.tokenizer)
        self.scheduler = Scheduler(config.max_running_requests, config.max_waiting_requests,
                                   config.max_prefill_tokens)
        self.sampler = Sampler()
        self.stats = EngineStats(num_moe_layers=len(self.runner.moe_layers),
                                 num_experts=self.num_experts)
        self._ids = itertools.count()
        self._last_step: tuple[list[Sequence], bool] = ([], False)
        self.default_budget = resolve_budget(config.default_budget, "default_budget",
                                             self.num_experts)
        torch.manual_seed(config.seed)

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params, budget: int | str | None = None,
                    request_id: str | None = None) -> str:
        """Queue a request; raises ValueError naming the field, or QueueFull.

        budget: experts per MoE layer per decode step, an int 1..E or "dense"; None = the
        engine's default_budget.
        """
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        budget = self.resolve_budget(budget)
        self.validate(prompt_ids, params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        gen = None
        if params.seed is not None:
            gen = torch.Generator(self.runner.device).manual_seed(params.seed)
        seq = Sequence(rid, prompt_ids, params, budget, Detokenizer(self.tokenizer, params.stop),
                       generator=gen)
        self.scheduler.add(seq)
        return rid

    def resolve_budget(self, budget: int | str | None) -> int:
        """A caller's budget (int 1..E, "dense", None = default) -> an int in 1..E (E = dense)."""
        if budget is None:
            return self.default_budget
        return resolve_budget(budget, BUDGET_FIELD, self.num_experts)

    def validate(self, prompt_ids: list[int], params) -> None:
        vocab = self.runner.model.config.vocab_size
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if any((not isinstance(t, int)) or not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        if len(prompt_ids) + max(params.max_tokens, 1) > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the model's {self.max_model_len}")

    def abort(self, request_id: str) -> RequestOutput | None:
        """Drop a waiting or running request (call between steps); returns its final output."""
        seq = self.scheduler.remove_waiting(request_id)
        if seq is None:
            seq = self.scheduler.find_running(request_id)
            if seq is None:
                return None
            self.runner.release([self.scheduler.running.index(seq)])
            self.scheduler.retire([seq])
        seq.finish("abort")
        return self._output(seq, [], "")

    def fail_step(self, error: str) -> list[RequestOutput]:
        """After step() raised: finish the requests it was running with an error, free their rows.

        A failed prefill takes only the requests it was admitting (rows past the KV cache's, or
        their own rows if the failure came after the merge); a failed decode takes the whole batch,
        whose cache may hold a half-written step.
        """
        seqs, is_prefill = self._last_step
        if not is_prefill:
            seqs = list(self.scheduler.running)
        failed = {id(s) for s in seqs}
        rows = [b for b, s in enumerate(self.scheduler.running)
                if id(s) in failed and b < self.runner.kv.num_rows]
        self.runner.release(rows)
        self.scheduler.retire(seqs)
        outs = []
        for seq in seqs:
            seq.finish("error")
            outs.append(self._output(seq, [], "", error=error))
        return outs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # ---- the loop ----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        seqs, is_prefill = self._last_step = self.scheduler.schedule()
        if not seqs:
            return []
        try:
            logits, stats = self.runner.run(seqs, is_prefill)  # [B, V] last-position logits
            failed = self._fail_non_finite(seqs, logits)
            ok = [b for b, seq in enumerate(seqs) if not seq.is_finished]
            token_ids = self.sampler(logits[ok], [seqs[b] for b in ok])
            self.stats.record(stats)
            return failed + self.postprocess([seqs[b] for b in ok], token_ids, logits[ok], stats)
        except Exception:  # the batch's requests end with an error; the engine goes on
            err_id = uuid.uuid4().hex[:12]
            log.error("engine step failed (error id %s): %s", err_id, traceback.format_exc())
            return self.fail_step(f"the engine failed while running this request's batch "
                                  f"(error id {err_id}; the server log has the details)")

    def _fail_non_finite(self, seqs: list[Sequence], logits: torch.Tensor) -> list[RequestOutput]:
        """Finish every row whose logits are not all finite with an error (only that request)."""
        finite = torch.isfinite(logits).all(-1).tolist()  # [B]
        outs = []
        for seq, ok in zip(seqs, finite):
            if not ok:
                seq.finish("error")
                outs.append(self._output(seq, [], "", error=NON_FINITE))
        return outs

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], logits: torch.Tensor,
                    stats: StepStats) -> list[RequestOutput]:
        outputs = []
        for b, (seq, tok) in enumerate(zip(seqs, token_ids)):
            if stats.is_prefill and seq.params.max_tokens == 0:  # echo-only scoring request
                seq.finish("length")
                outputs.append(self._output(seq, [], ""))
                continue
            seq.output_ids.append(tok)
            if seq.params.logprobs is not None:
                seq.new_logprobs += token_logprobs(logits[b:b + 1], [tok], seq.params.logprobs)
            if not stats.is_prefill:
                seq.num_decode_steps += 1
                seq.experts_executed_sum += stats.mean_executed
                seq.experts_routed_sum += stats.mean_routed
            reason = self._finish_reason(seq, tok)
            delta = seq.detokenizer.update(seq.output_ids, final=reason is not None)
            if seq.detokenizer.stopped:
                reason = "stop"
            if reason is not None:
                seq.finish(reason)
            outputs.append(self._output(seq, [tok], delta))
        finished = [b for b, s in enumerate(self.scheduler.running) if s.is_finished]
        if finished:
            self.runner.release(finished)
            self.scheduler.retire([self.scheduler.running[b] for b in finished])
        return outputs

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        if tok in self.eos_ids and not seq.params.ignore_eos:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def _output(self, seq: Sequence, new_ids: list[int], text: str, error: str | None = None):
        executed, routed = seq.mean_experts()
        logprobs, seq.new_logprobs = (seq.new_logprobs if seq.params.logprobs is not None else None), []
        prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
        return RequestOutput(
            request_id=seq.request_id, token_ids=new_ids, text=text, logprobs=logprobs,
            prompt_logprobs=prompt_logprobs, finished=seq.is_finished,
            finish_reason=seq.finish_reason, num_prompt_tokens=len(seq.prompt_ids),
            num_output_tokens=len(seq.output_ids), budget=min(seq.budget, self.num_experts),
            experts_per_layer=executed, experts_per_layer_routed=routed, error=error,
            queue_time_s=None if seq.scheduled_time is None else seq.scheduled_time - seq.arrival_time)

    # ---- offline use -------------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], params, budget: int | None = None):
        """Run prompts to completion; returns {request_id: (token ids, text, last output)} in order."""
        rids = [self.add_request(p, params, budget) for p in prompts]
        results = {rid: ([], []) for rid in rids}
        last = {}
        while self.has_unfinished():
            for out in self.step():
                results[out.request_id][0].extend(out.token_ids)
                results[out.request_id][1].append(out.text)
                last[out.request_id] = out
        return [(results[r][0], "".join(results[r][1]), last[r]) for r in rids]
