"""What differs between the SGLang releases the plugin supports (0.5.17 through 0.5.23).

Every hooked target of plugin/__init__.py TARGETS exists with the same signature in 0.5.17 and
0.5.23 (read from both wheels; tests/plugin runs against both). The differences the hooks meet:

| what the plugin reads              | 0.5.17                                  | 0.5.23                                      |
|------------------------------------|-----------------------------------------|---------------------------------------------|
| `TopK` base class                  | `MultiPlatformOp` (forward bound in `__init__`) | `BaseFusedOp` (bound on the first call) |
| shared-expert columns of top-k     | `topk_config.num_fused_shared_experts`  | `topk_config.num_shared_topk_slots` (property) |
| MoE runner backend of a layer      | global `get_moe_runner_backend()`; the experts' `quant_method.runner.runner_backend` | `topk_config.runner_backend` (bound by `bind_runner_backend`) |
| draft-model `TopK`                 | no `is_draft` (drafts: `ModelRunner.is_draft_worker`) | `TopK.is_draft`                 |
| `TopK(layer_id=...)`               | optional                                | required                                    |
| `runtime_context.publish`          | `publish(server_args, role=, hf_config=)` | `publish(server_args, role=, ranks=SpawnRanks(...))` |
| `ServerArgs`                       | dataclass                               | msgspec Struct (`__post_init__` hooks never run) |
| `StandardTopKOutput` fields        | `topk_weights, topk_ids, router_logits` | same                                        |
| `ForwardBatch.init_new`, `ModelRunner._forward_raw`, `DecodeCudaGraphRunner.capture`, `CPUGraphRunner.__init__`, `TokenizerManager.generate_request`, `ServerArgs.check_server_args`, `custom_params` (completions and chat) | same | same |

The helpers below detect the feature, not the version string.
"""

from __future__ import annotations


def shared_topk_columns(topk_config) -> int:
    """Trailing top-k columns that hold fused shared experts (BASE leaves them as they are)."""
    slots = getattr(topk_config, "num_shared_topk_slots", None)  # 0.5.23
    if slots is None:
        slots = getattr(topk_config, "num_fused_shared_experts", 0)  # 0.5.17
    return int(slots or 0)


def is_draft_topk(topk) -> bool:
    """A draft model's TopK (0.5.23 marks it; 0.5.17 has no mark: its runner is_draft_worker)."""
    return bool(getattr(topk, "is_draft", False))


def moe_runner_backends(model):
    """(module name, MoE runner backend) for every MoE layer of a loaded SGLang model.

    0.5.23 binds the backend to each TopK (topk_config.runner_backend, None while unbound); 0.5.17
    keeps it in each experts layer's runner only (quant_method.runner.runner_backend).
    """
    from sglang.srt.layers.moe.topk import TopK, TopKConfig

    bound = "runner_backend" in TopKConfig.__dataclass_fields__
    for name, module in model.named_modules():
        if bound:
            if isinstance(module, TopK):
                yield name, module.topk_config.runner_backend
            continue
        runner = getattr(getattr(module, "quant_method", None), "runner", None)
        backend = getattr(runner, "runner_backend", None)
        if backend is not None:
            yield name, backend


def publish_process_config(server_args, world_rank: int = 0) -> None:
    """Install SGLang's process-wide config for a process that is not a server (tests, the CPU TP
    simulation, GPU check scripts), as a scheduler would: fresh context, role "test"; 0.5.23 takes
    this process's ranks (SpawnRanks), 0.5.17 has no rank argument."""
    import inspect

    from sglang.srt import runtime_context

    runtime_context.reset_context()
    if "ranks" in inspect.signature(runtime_context.publish).parameters:  # 0.5.23
        ranks = runtime_context.SpawnRanks(world_rank=world_rank, dp_rank=None)
        runtime_context.publish(server_args, role="test", ranks=ranks)
    else:  # 0.5.17
        runtime_context.publish(server_args, role="test")
