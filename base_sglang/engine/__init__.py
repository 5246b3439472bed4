"""Native engine: continuous batching over a transformers MoE model with BASE in its decode steps.

Names are exported lazily so `import base_sglang.engine.moe_hook` stays torch-only.
"""

from importlib import import_module

_EXPORTS = {
    "AsyncLLMEngine": ".async_engine",
    "DEFAULT_MODEL_DIR": ".config",
    "EngineConfig": ".config",
    "LLMEngine": ".llm_engine",
    "SamplingParams": ".sampling_params",
    "QueueFull": ".scheduler",
    "RequestOutput": ".sequence",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
