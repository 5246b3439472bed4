"""The native engine: add requests, then step() = schedule -> run -> sample -> postprocess."""

from __future__ import annotations

import itertools
import logging
import traceback
import uuid

import torch

from ..core.budget import BUDGET_FIELD, resolve_budget, resolve_request_budget
from ..hf import eos_token_ids
from ..protocol import RequestOutput
from .config import EngineConfig
from .detokenizer import Detokenizer
from .grammar import GrammarCompiler
from .model_runner import ModelRunner
from .outputs import delta_output, hold, ranked_outputs
from .sampler import NO_TOKEN, Sampler, chosen_logprobs, token_logprobs
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats, StepStats

log = logging.getLogger(__name__)
NON_FINITE = ("the model produced non-finite logits (NaN or Inf) for this request; it was "
              "stopped (other requests in the batch are unaffected)")
NO_TOKEN_LEFT = ("no token is allowed at this point (the response_format grammar, logit_bias and "
                 "min_tokens together exclude every token); the request was stopped")
GRAMMAR_REJECTED = "the sampled token does not fit the response_format grammar; the request was stopped"
SEED_STRIDE = 0x9E3779B97F4A7C15  # choice i of a seeded request uses seed + i * stride (mod 2**64)


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.runner = ModelRunner(config)
        self.tokenizer = self.runner.tokenizer
        self.num_experts = self.runner.num_experts
        model_cfg = self.runner.model.config
        self.vocab_size = model_cfg.vocab_size
        self.max_model_len = config.max_model_len or model_cfg.max_position_embeddings
        self.eos_ids = eos_token_ids(self.runner.model, self.tokenizer)
        self.scheduler = Scheduler(config.max_running_requests, config.max_waiting_requests,
                                   config.max_prefill_tokens)
        self.sampler = Sampler(self.eos_ids)
        self.grammar = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_ids)
        self.stats = EngineStats(num_moe_layers=len(self.runner.moe_layers),
                                 num_experts=self.num_experts)
        self._ids = itertools.count()
        self._last_step: tuple[list[Sequence], bool] = ([], False)
        self.default_budget = resolve_budget(config.default_budget, "default_budget",
                                             self.num_experts)
        torch.manual_seed(config.seed)

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params, budget: int | str | dict | None = None,
                    request_id: str | None = None, max_error: float | None = None) -> str:
        """Queue a request (its n or best_of choices); raises ValueError naming the field, or
        QueueFull.

        budget: experts per MoE layer per decode step, an int 1..E or "dense", or an
        error-targeted budget {"max_error": 0..1, "max_experts": 1..E}; None = the engine's
        default_budget. max_error: the same bound given beside an int budget (its cap).
        """
        prompt_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        budget, max_error = self.resolve_request_budget(budget, max_error)
        self.validate(prompt_ids, params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        group: list[Sequence] = []
        for i in range(params.num_sequences):
            grammar = (self.grammar.matcher(params.response_format)
                       if params.response_format is not None else None)
            Sequence(rid, prompt_ids, params, budget, Detokenizer(self.tokenizer, params.stop),
                     generator=self._generator(params.seed, i), index=i, group=group,
                     grammar=grammar, max_error=max_error)
        self.scheduler.add(group)
        return rid

    def _generator(self, seed: int | None, index: int) -> torch.Generator | None:
        """Choice i of a seeded request draws from its own generator (choice 0: the seed itself)."""
        if seed is None:
            return None
        return torch.Generator(self.runner.device).manual_seed((seed + index * SEED_STRIDE) % 2**64)

    def resolve_budget(self, budget: int | str | None) -> int:
        """A caller's budget (int 1..E, "dense", None = default) -> an int in 1..E (E = dense)."""
        if budget is None:
            return self.default_budget
        return resolve_budget(budget, BUDGET_FIELD, self.num_experts)

    def resolve_request_budget(self, budget, max_error: float | None = None
                               ) -> tuple[int, float | None]:
        """Either budget form (see add_request) -> (int 1..E, max_error or None). A max_error given
        beside budget bounds it, with budget (None = E) as the cap."""
        if max_error is not None:
            if isinstance(budget, dict):
                raise ValueError(f"{BUDGET_FIELD}: max_error is given twice")
            cap = {} if budget is None else {"max_experts": self.resolve_budget(budget)}
            budget = {"max_error": max_error, **cap}
        if budget is None:
            return self.default_budget, None
        return resolve_request_budget(budget, BUDGET_FIELD, self.num_experts, self.config.policy)

    def validate(self, prompt_ids: list[int], params) -> None:
        """Raise ValueError naming the field for anything this engine cannot serve (compiles the
        response_format grammar, cached: see compile_grammar)."""
        vocab = self.vocab_size
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if any((not isinstance(t, int)) or not 0 <= t < vocab for t in prompt_ids):
            raise ValueError(f"prompt: token ids must be integers in [0, {vocab})")
        if len(prompt_ids) + max(params.max_tokens, 1) > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the model's {self.max_model_len}")
        if params.num_sequences > self.scheduler.max_running:
            name = "best_of" if params.best_of is not None else "n"
            raise ValueError(f"{name}: {params.num_sequences} choices exceed the engine's "
                             f"{self.scheduler.max_running} running sequences")
        for name, ids in (("logit_bias", params.logit_bias or ()),
                          ("stop_token_ids", params.stop_token_ids)):
            if any(t >= vocab for t in ids):
                raise ValueError(f"{name}: token ids must be in [0, {vocab})")
        self.compile_grammar(params)

    def compile_grammar(self, params) -> None:
        """Compile params.response_format into the grammar cache (ValueError "response_format:
        ..." if the grammar library rejects it). Thread-safe; a server calls it off its event
        loop before submitting, so the engine thread only meets cache hits."""
        if params.response_format is not None:
            self.grammar.compile(params.response_format)

    def abort(self, request_id: str) -> list[RequestOutput]:
        """Drop a waiting or running request (call between steps); returns the final output of
        each of its choices that had not finished ([] for an unknown request)."""
        group = self.scheduler.remove_waiting(request_id)
        if group is None:
            running = self.scheduler.find_running(request_id)
            if not running:
                return []
            self.runner.release([self.scheduler.running.index(s) for s in running])
            self.scheduler.retire(running)
            group = running[0].group
        left = [s for s in group if not s.is_finished]
        for seq in left:
            seq.finish("abort")
        if group[0].params.holds_outputs:
            return ranked_outputs(group, self.num_experts)
        return [delta_output(s, [], "", self.num_experts) for s in left]

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
        return self._fail(seqs, error)

    def _fail(self, seqs: list[Sequence], error: str) -> list[RequestOutput]:
        """End every unfinished choice of the requests of seqs with an error (rows are released
        by the caller, or by postprocess for rows still in the batch)."""
        outs, groups = [], {id(s.group): s.group for s in seqs}
        for group in groups.values():
            left = [s for s in group if not s.is_finished]
            for seq in left:
                seq.finish("error")
            if group[0].params.holds_outputs:
                outs += ranked_outputs(group, self.num_experts, error=error)
            else:
                outs += [delta_output(s, [], "", self.num_experts, error=error) for s in left]
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
            failed = self._fail_rows(seqs, ~torch.isfinite(logits).all(-1), NON_FINITE)
            ok = [b for b, seq in enumerate(seqs) if not seq.is_finished]
            token_ids = self.sampler(logits[ok], [seqs[b] for b in ok])
            self.stats.record(stats)
            return failed + self.postprocess([seqs[b] for b in ok], token_ids, logits[ok], stats)
        except Exception:  # the batch's requests end with an error; the engine goes on
            err_id = uuid.uuid4().hex[:12]
            log.error("engine step failed (error id %s): %s", err_id, traceback.format_exc())
            return self.fail_step(f"the engine failed while running this request's batch "
                                  f"(error id {err_id}; the server log has the details)")

    def _fail_rows(self, seqs: list[Sequence], bad: torch.Tensor, error: str):
        """Fail the requests of the rows where bad [B] is True (all their choices, nothing else)."""
        rows = bad.nonzero()[:, 0].tolist()
        return self._fail([seqs[b] for b in rows], error) if rows else []

    def postprocess(self, seqs: list[Sequence], token_ids: list[int], logits: torch.Tensor,
                    stats: StepStats) -> list[RequestOutput]:
        outputs = self._fail([s for s, t in zip(seqs, token_ids) if t == NO_TOKEN], NO_TOKEN_LEFT)
        ranked = [b for b, s in enumerate(seqs) if s.params.holds_outputs and not s.is_finished]
        cum = dict(zip(ranked, chosen_logprobs(logits[ranked], [token_ids[b] for b in ranked])
                       if ranked else []))
        done_groups = {}
        for b, (seq, tok) in enumerate(zip(seqs, token_ids)):
            if seq.is_finished:  # failed above, or with a sibling
                continue
            step = self._advance(seq, tok, logits[b:b + 1], cum.get(b, 0.0), stats)
            if step is None:
                outputs += self._fail([seq], GRAMMAR_REJECTED)
            elif not seq.params.holds_outputs:
                outputs.append(delta_output(seq, *step, self.num_experts))
            else:
                hold(seq)
                if seq.is_group_finished:
                    done_groups[id(seq.group)] = seq.group
        for group in done_groups.values():
            if all(s.finish_reason != "error" for s in group):
                outputs += ranked_outputs(group, self.num_experts)
        self._retire_finished()
        return outputs

    def _advance(self, seq: Sequence, tok: int, logits: torch.Tensor, logprob: float,
                 stats: StepStats) -> tuple[list[int], str] | None:
        """Append a sampled token (logits [1, V] its row); returns (new ids, new text), or None
        if the sequence's grammar rejects the token."""
        if stats.is_prefill and seq.params.max_tokens == 0:  # echo-only scoring request
            seq.finish("length")
            return [], ""
        seq.output_ids.append(tok)
        seq.cumulative_logprob += logprob
        if seq.params.logprobs is not None:
            seq.new_logprobs += token_logprobs(logits, [tok], seq.params.logprobs)
        if not stats.is_prefill:
            seq.num_decode_steps += 1
            seq.experts_executed_sum += stats.mean_executed
            seq.experts_routed_sum += stats.mean_routed
        if seq.grammar is not None and not seq.grammar.accept(tok):
            return None
        reason = self._finish_reason(seq, tok)
        delta = seq.detokenizer.update(seq.output_ids, final=reason is not None,
                                       check_stop=len(seq.output_ids) >= seq.params.min_tokens)
        if seq.detokenizer.stopped:
            reason = "stop"
        if reason is not None:
            seq.finish(reason)
        return [tok], delta

    def _retire_finished(self) -> None:
        finished = [b for b, s in enumerate(self.scheduler.running) if s.is_finished]
        if finished:
            self.runner.release(finished)
            self.scheduler.retire([self.scheduler.running[b] for b in finished])

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        if seq.grammar is not None and seq.grammar.is_terminated:
            return "stop"
        if (tok in self.eos_ids and not seq.params.ignore_eos) or tok in seq.params.stop_token_ids:
            return "stop"
        if len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    # ---- offline use -------------------------------------------------------------------------
    def generate(self, prompts: list[str | list[int]], params, budget=None):
        """Run prompts to completion; returns [(token ids, text, last output)] in prompt order
        (choice 0 of each; see generate_choices for all n)."""
        return [choices[0] for choices in self.generate_choices(prompts, params, budget)]

    def generate_choices(self, prompts: list[str | list[int]], params, budget=None):
        """Run prompts to completion; returns, per prompt, its n choices [(token ids, text, last
        output)] by choice index."""
        rids = [self.add_request(p, params, budget) for p in prompts]
        results = {(rid, i): ([], [], None) for rid in rids for i in range(params.n)}
        while self.has_unfinished():
            for out in self.step():
                ids, texts, _ = results[(out.request_id, out.index)]
                results[(out.request_id, out.index)] = (ids + out.token_ids, texts + [out.text], out)
        return [[(results[(r, i)][0], "".join(results[(r, i)][1]), results[(r, i)][2])
                 for i in range(params.n)] for r in rids]
