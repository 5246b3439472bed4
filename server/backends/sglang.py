"""The sglang backend: SGLang's Engine in this process, BASE through the plugin, our OpenAI routes.

    base-serve --backend sglang --model DIR [--predictor FILE] [SGLang server args, e.g. --tp-size 2]

base-serve's own flags (--model, --predictor, --policy, --default-budget, --max-running-requests,
--device, --dtype, --served-model-name) are mapped onto SGLang's ServerArgs; every other argument is
parsed by SGLang's own argument parser. The plugin is configured through the BASE_* environment
variables that SGLang's scheduler processes inherit (base_sglang/plugin/config.py), so they are set
here before the Engine loads plugins. Each request's budget reaches the scheduler as
sampling_params["custom_params"]["expert_budget"], exactly as on SGLang's own HTTP server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from dataclasses import replace
from pathlib import Path

from base_sglang.core import Predictor
from base_sglang.core.budget import BUDGET_FIELD, resolve_budget
from base_sglang.plugin.budget import BUDGET_KEY
from base_sglang.plugin.checks import check_server_args
from base_sglang.protocol import JSON_OBJECT_SCHEMA, SEED_STRIDE, RequestOutput, TokenLogprob

# SGLang's model classes that ignore tie_word_embeddings (read in sglang 0.5.17 and 0.5.23; seen on
# the H200: the shipped proxy, tied, decoded garbage from its first token)
UNTIED_ONLY = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral")
FINISH_REASONS = {"stop": "stop", "length": "length"}  # SGLang's finish types; others -> "abort"


class SGLangBackend:
    def __init__(self, engine, name: str, num_experts: int, policy: str):
        self.engine = engine
        self.name = name
        self.num_experts = num_experts
        self.policy = policy
        manager = engine.tokenizer_manager
        self.max_model_len = manager.context_len
        self.tokenizer = manager.tokenizer
        self.capacity = None  # SGLang queues without a bound of its own
        self._children: dict[str, list[str]] = {}  # request id -> its choices' SGLang rids

    async def start(self) -> None:  # the Engine started in create_backend (it blocks while loading)
        pass

    async def stop(self) -> None:
        self.engine.shutdown()

    def generate(self, prompt_ids, params, budget, request_id, max_error=None):
        refuse_max_error(max_error)
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + max(params.max_tokens, 1) > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the model's {self.max_model_len}")
        if params.num_sequences == 1:
            return self._one(list(prompt_ids), params, budget, request_id, 0)
        return self._choices(list(prompt_ids), params, budget, request_id)

    async def _one(self, prompt_ids, params, budget, rid, index, ranked=False):
        """One SGLang request (one choice) as RequestOutput deltas tagged with `index`."""
        gen = await self.engine.async_generate(
            input_ids=prompt_ids, sampling_params=sglang_sampling_params(params, budget, index),
            stream=True, rid=rid, **logprob_args(params, ranked))
        finished, first = False, True
        try:
            async for out in gen:
                refused(out, params)
                ro = request_output(out, rid, budget, params, first, index, ranked)
                finished, first = ro.finished, False
                yield ro
        finally:
            if not finished:  # client gone or task cancelled: free the batch slot
                self.abort(rid)

    async def _choices(self, prompt_ids, params, budget, request_id):
        """n (or best_of) choices as SGLang's own parallel sampling runs them: the prompt is
        prefilled once into the radix cache (a max_new_tokens=0 request), then one request per
        choice with its own seed. (SGLang's `n` itself gives every copy the same sampling_seed
        and fresh request ids that Engine.abort_request cannot reach, so it is not used.)"""
        k = params.num_sequences
        rids = [f"{request_id}-{i}" for i in range(k)]
        self._children[request_id] = rids
        try:
            await self.engine.async_generate(
                input_ids=prompt_ids, sampling_params={"max_new_tokens": 0, **_custom(budget)},
                rid=f"{request_id}-prefill")
            ranked = params.holds_outputs
            streams = [self._one(prompt_ids, params, budget, rid, i, ranked)
                       for i, rid in enumerate(rids)]
            whole = [None] * k
            async with contextlib.aclosing(_interleave(streams)) as outputs:
                async for out in outputs:
                    if not ranked:
                        yield out
                    else:
                        i = out.index
                        whole[i] = out if whole[i] is None else _fold(whole[i], out)
            if ranked:
                for out in best_of(whole, params.n, params.logprobs is not None):
                    yield out
        finally:
            self._children.pop(request_id, None)

    def abort(self, request_id: str) -> None:
        for rid in self._children.get(request_id) or [request_id]:
            self.engine.tokenizer_manager.abort_request(rid=rid)

    def compile_grammar(self, params) -> None:
        """SGLang compiles response_format (json_schema) in its own grammar backend; a schema it
        rejects ends the request as a 400 (refused())."""

    def error_status(self, error: str) -> int:
        return 500

    def abort_all(self, error: str) -> int:
        live = list(getattr(self.engine.tokenizer_manager, "rid_to_state", {}))
        for rid in live:
            self.abort(rid)
        return len(live)

    def describe(self) -> dict:
        args = self.engine.server_args
        return {"backend": "sglang", "model": args.model_path, "served_as": self.name,
                "policy": self.policy, "num_experts": self.num_experts,
                "predictor": os.environ.get("BASE_PREDICTOR", "none"),
                "default_budget": os.environ.get("BASE_DEFAULT_BUDGET", "dense"),
                "tp_size": args.tp_size, "max_model_len": self.max_model_len,
                "max_running_requests": args.max_running_requests}

    def stats(self) -> dict:
        live = len(getattr(self.engine.tokenizer_manager, "rid_to_state", {}))
        return {"num_requests_running": live, "num_requests_waiting": 0, "engine": None}


# ---- request and output mapping -------------------------------------------------------------------
def choice_seed(seed: int | None, index: int) -> int | None:
    """The seed of choice `index` (the native engine's rule: seed + index * SEED_STRIDE mod
    2**64), as the signed 64-bit integer SGLang's sampling_seed takes."""
    if seed is None:
        return None
    s = (seed + index * SEED_STRIDE) % 2**64
    return s - 2**64 if s >= 2**63 else s


def refuse_max_error(max_error: float | None) -> None:
    """The plugin reads only an expert count: an error-targeted budget is refused, naming it."""
    if max_error is not None:
        raise ValueError(f"{BUDGET_FIELD}.max_error: error-targeted budgets are not supported by "
                         f"the sglang backend; the native backend (--backend native) supports "
                         f"them (send an expert count here)")


def _custom(budget: int | None) -> dict:
    return {} if budget is None else {"custom_params": {BUDGET_KEY: budget}}


def sglang_sampling_params(params, budget: int | None, index: int = 0) -> dict:
    """engine.SamplingParams (+ budget) -> the sampling_params dict of SGLang's GenerateReqInput
    for choice `index` (SGLang's own fields and ranges; JSON keys of logit_bias are strings)."""
    sp = {"temperature": params.temperature, "top_p": params.top_p,
          "max_new_tokens": params.max_tokens, "stop": list(params.stop),
          "ignore_eos": params.ignore_eos, "min_p": params.min_p,
          "frequency_penalty": params.frequency_penalty,
          "presence_penalty": params.presence_penalty,
          "repetition_penalty": params.repetition_penalty, "min_new_tokens": params.min_tokens}
    if params.top_k > 0:
        sp["top_k"] = params.top_k
    if params.seed is not None:
        sp["sampling_seed"] = choice_seed(params.seed, index)
    if params.stop_token_ids:
        sp["stop_token_ids"] = list(params.stop_token_ids)
    if params.logit_bias:
        sp["logit_bias"] = {str(t): b for t, b in params.logit_bias.items()}
    fmt = params.response_format
    if fmt is not None:  # SGLang's mapping of OpenAI's response_format (json_object = object)
        sp["json_schema"] = JSON_OBJECT_SCHEMA if fmt.type == "json_object" else fmt.schema
    sp.update(_custom(budget))
    return sp


def logprob_args(params, ranked: bool = False) -> dict:
    """Logprob request fields; best_of ranking needs the output logprobs even when not asked."""
    if params.logprobs is None and params.prompt_logprobs is None and not ranked:
        return {}
    top = max(params.logprobs or 0, params.prompt_logprobs or 0)
    return {"return_logprob": True, "top_logprobs_num": top,
            "logprob_start_len": 0 if params.prompt_logprobs is not None else -1}


def refused(out: dict, params) -> None:
    """SGLang ends a request it refuses (e.g. a grammar its backend cannot compile) with an abort
    carrying status 400: raise it as the 400 it is (ValueError naming the field)."""
    reason = out["meta_info"].get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort" \
            and reason.get("status_code") == 400:
        message = reason.get("message") or "refused by SGLang"
        field = "response_format" if params.response_format is not None else "request"
        raise ValueError(f"{field}: {message}")


def request_output(out: dict, request_id: str, budget: int, params, first: bool,
                   index: int = 0, ranked: bool = False) -> RequestOutput:
    """One streamed SGLang output (incremental_streaming_output: deltas) -> engine.RequestOutput
    of choice `index` (ranked: with the choice's logprobs, which best_of sums)."""
    meta = out["meta_info"]
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    logprobs = prompt_logprobs = None
    if params.logprobs is not None or ranked:
        logprobs = _logprobs(meta.get("output_token_logprobs") or [],
                             meta.get("output_top_logprobs"))
    if params.prompt_logprobs is not None and first:
        prompt_logprobs = [None if lp.logprob is None else lp for lp in
                           _logprobs(meta.get("input_token_logprobs") or [],
                                     meta.get("input_top_logprobs"))]
    return RequestOutput(
        request_id=request_id, token_ids=list(out.get("output_ids") or []),
        text=out.get("text") or "", logprobs=logprobs, prompt_logprobs=prompt_logprobs,
        finished=reason is not None,
        finish_reason=None if reason is None else FINISH_REASONS.get(kind, "abort"),
        num_prompt_tokens=meta.get("prompt_tokens", 0),
        num_output_tokens=meta.get("completion_tokens", 0),
        budget=budget, index=index,
        experts_per_layer=None, experts_per_layer_routed=None)  # logged by the plugin instead


async def _interleave(streams):
    """Outputs of several async streams in arrival order; leaving early closes them all."""
    q: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(stream):
        try:
            async for out in stream:
                await q.put(out)
        except Exception as exc:  # re-raised in the consumer
            q.put_nowait(exc)
        finally:
            q.put_nowait(done)

    tasks = [asyncio.ensure_future(pump(s)) for s in streams]
    left = len(tasks)
    try:
        while left:
            item = await q.get()
            if item is done:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _fold(acc: RequestOutput, out: RequestOutput) -> RequestOutput:
    """A choice's outputs so far, folded into one (tokens, text and logprobs appended)."""
    return replace(out, token_ids=acc.token_ids + out.token_ids, text=acc.text + out.text,
                   logprobs=(acc.logprobs or []) + (out.logprobs or []),
                   prompt_logprobs=acc.prompt_logprobs or out.prompt_logprobs)


def best_of(whole: list[RequestOutput], n: int, keep_logprobs: bool) -> list[RequestOutput]:
    """The n choices with the highest sum of token logprobs (ties: lower index), re-indexed
    0..n-1, as the native engine ranks best_of; a failed choice fails them all unranked."""
    if any(o is None or o.finish_reason in ("abort", "error") for o in whole):
        best = [o for o in whole if o is not None][:n]
    else:
        score = [sum(lp.logprob for lp in o.logprobs or []) for o in whole]
        order = sorted(range(len(whole)), key=lambda i: (-score[i], i))[:n]
        best = [replace(whole[i], cumulative_logprob=score[i]) for i in order]
    return [replace(o, index=j, logprobs=o.logprobs if keep_logprobs else None)
            for j, o in enumerate(best)]


def _logprobs(entries, tops) -> list[TokenLogprob]:
    """SGLang (logprob, token_id, text) tuples (+ per-position top lists) -> TokenLogprob."""
    tops = tops or [None] * len(entries)
    return [TokenLogprob(token_id=tid, logprob=lp,
                         top={t: v for v, t, _ in (top or []) if v is not None})
            for (lp, tid, _), top in zip(entries, tops)]


# ---- startup ----------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print and exit; base-serve prints ValueErrors itself
        raise ValueError(f"sglang server arguments: {message}")


def build_server_args(settings):
    """base-serve settings + backend_args -> SGLang ServerArgs (parsed by SGLang's own parser)."""
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="base-serve --backend sglang", add_help=False)
    ServerArgs.add_cli_args(parser)
    extra = list(settings.backend_args)
    argv = ["--model-path", str(settings.model), *extra,
            "--max-running-requests", str(settings.max_running_requests)]
    if not any(a.split("=")[0] == "--moe-runner-backend" for a in extra):
        argv += ["--moe-runner-backend", "triton"]  # BASE edits the Triton runner's top-k ids
    if settings.served_model_name:
        argv += ["--served-model-name", settings.served_model_name]
    if settings.device != "auto":
        argv += ["--device", settings.device]
    if settings.dtype != "auto":
        argv += ["--dtype", settings.dtype]
    ns = parser.parse_args(argv)
    ns.incremental_streaming_output = True  # request_output() expects deltas
    return ServerArgs.from_cli_args(ns)


def plugin_env(settings, predictor: str | None) -> dict[str, str]:
    """The BASE_* variables the plugin reads in SGLang's processes (plugin/config.py)."""
    env = {"BASE_POLICY": settings.policy, "BASE_DEFAULT_BUDGET": str(settings.default_budget)}
    if predictor is not None:
        env["BASE_PREDICTOR"] = predictor
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if allowed and "base" not in {x.strip() for x in allowed.split(",")}:
        env["SGLANG_PLUGINS"] = f"{allowed},base"
    return env


def preflight(settings) -> tuple[str | None, int]:
    """Check model dir, predictor and budgets before starting anything: (predictor path, E)."""
    model = Path(settings.model)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"model: no Hugging Face checkpoint (config.json) in {model}")
    config = json.loads((model / "config.json").read_text())
    from base_sglang.core.predictor import describe_model_config

    num_experts = describe_model_config(config)["num_experts"]
    if not num_experts:
        raise ValueError(f"model: {model} is not a MoE model (no num_experts in config.json)")
    if config.get("tie_word_embeddings") and config.get("model_type") in UNTIED_ONLY:
        raise ValueError(f"model: {model} ties its embeddings (tie_word_embeddings), which SGLang's "
                         f"{config['model_type']} ignores: its LM head would be uninitialised. "
                         f"Serve an untied copy: python -m base_sglang.hf.untie {model} DST_DIR")
    resolve_budget(settings.default_budget, "default_budget", num_experts)
    predictor = settings.predictor or str(model / "predictor.safetensors")
    if not Path(predictor).is_file():
        if settings.predictor is None and settings.policy == "dense":
            return None, num_experts  # dense serving: the plugin stays off
        raise FileNotFoundError(f"predictor: {predictor} not found; pass --predictor FILE "
                                f"(made by base-calibrate for this model)")
    Predictor.load(predictor).validate(config)  # PredictorMismatch names the field
    return predictor, num_experts


def create_backend(settings) -> SGLangBackend:
    predictor, num_experts = preflight(settings)
    try:
        from sglang.srt.entrypoints.engine import Engine
    except ImportError as exc:
        raise ValueError(f"backend: sglang (0.5.17 .. 0.5.23) is not importable here ({exc}); "
                         f"pip install 'base-sglang[sglang]' on a GPU node, or on an offline "
                         f"one install benchmarks/gpu's bundle") from exc
    os.environ.update(plugin_env(settings, predictor))
    server_args = build_server_args(settings)
    if predictor is not None:
        check_server_args(server_args)  # the same refusal the plugin makes, before any process
    engine = Engine(server_args=server_args)
    return SGLangBackend(engine, settings.served_model_name or Path(settings.model).name,
                         num_experts, settings.policy)
