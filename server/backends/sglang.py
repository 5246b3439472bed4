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
import json
import os
from pathlib import Path

from base_sglang.core import Predictor
from base_sglang.core.budget import resolve_budget
from base_sglang.plugin.budget import BUDGET_KEY
from base_sglang.plugin.checks import check_server_args
from base_sglang.protocol import RequestOutput, TokenLogprob

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

    async def start(self) -> None:  # the Engine started in create_backend (it blocks while loading)
        pass

    async def stop(self) -> None:
        self.engine.shutdown()

    def generate(self, prompt_ids, params, budget, request_id):
        if not prompt_ids:
            raise ValueError("prompt: must contain at least one token")
        if len(prompt_ids) + max(params.max_tokens, 1) > self.max_model_len:
            raise ValueError(f"max_tokens: prompt ({len(prompt_ids)} tokens) + max_tokens "
                             f"({params.max_tokens}) exceeds the model's {self.max_model_len}")
        return self._stream(list(prompt_ids), params, budget, request_id)

    async def _stream(self, prompt_ids, params, budget, request_id):
        gen = await self.engine.async_generate(
            input_ids=prompt_ids, sampling_params=sglang_sampling_params(params, budget),
            stream=True, rid=request_id, **logprob_args(params))
        finished, first = False, True
        try:
            async for out in gen:
                ro = request_output(out, request_id, budget, params, first)
                finished, first = ro.finished, False
                yield ro
        finally:
            if not finished:  # client gone or task cancelled: free the batch slot
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self.engine.tokenizer_manager.abort_request(rid=request_id)

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
def sglang_sampling_params(params, budget: int | None) -> dict:
    """engine.SamplingParams (+ budget) -> the sampling_params dict of SGLang's GenerateReqInput."""
    sp = {"temperature": params.temperature, "top_p": params.top_p,
          "max_new_tokens": params.max_tokens, "stop": list(params.stop),
          "ignore_eos": params.ignore_eos}
    if params.top_k > 0:
        sp["top_k"] = params.top_k
    if params.seed is not None:
        sp["sampling_seed"] = params.seed
    if budget is not None:
        sp["custom_params"] = {BUDGET_KEY: budget}
    return sp


def logprob_args(params) -> dict:
    if params.logprobs is None and params.prompt_logprobs is None:
        return {}
    top = max(params.logprobs or 0, params.prompt_logprobs or 0)
    return {"return_logprob": True, "top_logprobs_num": top,
            "logprob_start_len": 0 if params.prompt_logprobs is not None else -1}


def request_output(out: dict, request_id: str, budget: int, params, first: bool) -> RequestOutput:
    """One streamed SGLang output (incremental_streaming_output: deltas) -> engine.RequestOutput."""
    meta = out["meta_info"]
    reason = meta.get("finish_reason")
    kind = reason.get("type") if isinstance(reason, dict) else reason
    logprobs = prompt_logprobs = None
    if params.logprobs is not None:
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
        budget=budget,
        experts_per_layer=None, experts_per_layer_routed=None)  # logged by the plugin instead


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
