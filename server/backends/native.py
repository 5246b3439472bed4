"""The native backend: LLMEngine (transformers model + BASE) behind AsyncLLMEngine's thread loop."""

from __future__ import annotations

from pathlib import Path

import torch

from base_sglang.core.budget import budget_label
from base_sglang.engine import AsyncLLMEngine, EngineConfig, LLMEngine
from base_sglang.engine.llm_engine import NO_TOKEN_LEFT

# failures that the request's own settings caused (answered 400, not 500): its response_format
# grammar, logit_bias and min_tokens left no token to sample
CLIENT_ERRORS = frozenset({NO_TOKEN_LEFT})


class NativeBackend:
    def __init__(self, engine: LLMEngine, name: str):
        self.engine = engine
        self.async_engine = AsyncLLMEngine(engine)
        self.name = name
        self.num_experts = engine.num_experts
        self.max_model_len = engine.max_model_len
        self.policy = engine.config.policy
        self.tokenizer = engine.tokenizer
        self.capacity = self.async_engine.capacity

    async def start(self) -> None:
        self.async_engine.start()

    async def stop(self) -> None:
        self.async_engine.stop()

    def generate(self, prompt_ids, params, budget, request_id, max_error=None):
        return self.async_engine.generate(prompt_ids, params, budget, request_id, max_error)

    def abort(self, request_id: str) -> None:
        self.async_engine.abort(request_id)

    def compile_grammar(self, params) -> None:
        self.engine.compile_grammar(params)  # blocking: the server calls it in a worker thread

    def error_status(self, error: str) -> int:
        return 400 if error in CLIENT_ERRORS else 500

    def abort_all(self, error: str) -> int:
        return self.async_engine.abort_all(error)

    def stats(self) -> dict:
        sched = self.engine.scheduler
        return {"num_requests_running": len(sched.running), "num_requests_waiting": len(sched.waiting),
                "engine": self.engine.stats}

    def describe(self) -> dict:
        runner, cfg = self.engine.runner, self.engine.config
        return {"backend": "native", "model": cfg.model, "served_as": self.name,
                "policy": cfg.policy, "predictor": str(cfg.predictor_path or "none"),
                "default_budget": budget_label(self.engine.default_budget, self.num_experts),
                "num_experts": self.num_experts, "device": str(runner.device),
                "dtype": str(runner.dtype).replace("torch.", ""),
                "threads": torch.get_num_threads(), "max_model_len": self.max_model_len,
                "max_running_requests": cfg.max_running_requests,
                "max_waiting_requests": cfg.max_waiting_requests}


def engine_config(settings) -> EngineConfig:
    model = Path(settings.model)
    if not (model / "config.json").is_file():
        hint = ("the embedded proxy model is not installed at this path"
                if Path(settings.model).resolve() == Path(EngineConfig.model).resolve()
                else "no Hugging Face checkpoint (config.json) there")
        raise FileNotFoundError(f"model: {model} not found ({hint}); pass --model PATH "
                                f"(or set BASE_MODEL) to a local MoE checkpoint directory")
    return EngineConfig(model=str(model), predictor=settings.predictor, policy=settings.policy,
                        default_budget=settings.default_budget,
                        max_running_requests=settings.max_running_requests,
                        max_waiting_requests=settings.max_waiting_requests,
                        max_model_len=settings.max_model_len, device=settings.device,
                        dtype=settings.dtype, num_threads=settings.num_threads)


def create_backend(settings) -> NativeBackend:
    engine = LLMEngine(engine_config(settings))
    return NativeBackend(engine, settings.served_model_name or Path(settings.model).name)
