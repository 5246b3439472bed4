"""Native engine: continuous batching over a transformers MoE model with BASE in its decode steps.

Names are exported lazily: `import base_sglang.engine` loads nothing until a name is used.
"""

from importlib import import_module

_EXPORTS = {
    "AsyncLLMEngine": ".async_engine",
    "DEFAULT_MODEL_DIR": ".config",
    "EngineConfig": ".config",
    "LLMEngine": ".llm_engine",
    "SamplingParams": "..protocol",
    "QueueFull": "..protocol",
    "RequestOutput": "..protocol",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
