"""BASE as an SGLang general plugin (entry point `sglang.srt.plugins`: base = base_sglang.plugin:register).

SGLang calls `register()` in every process it starts (main, schedulers = TP workers, detokenizer)
through `sglang.srt.plugins.load_plugins()`, which then applies the registered hooks. Importing
this package patches nothing. BASE is switched on by BASE_PREDICTOR (see plugin/config.py);
without it every hook passes through.

The hooks, in the order a request meets them (details in plugin/hooks.py):
  ServerArgs.check_server_args        BEFORE  refuse EP/DeepEP, DP attention, EPLB, spec decoding ...
  TokenizerManager.generate_request   BEFORE  validate budgets, copy X-Expert-Budget into custom_params
  ModelRunner.load_model              AFTER   load + validate the predictor (target model only),
                                              fold it into the router GEMMs (BASE_FOLD)
  ModelRunner.init_cuda_graphs        BEFORE  allocate the static budget buffer
  DecodeCudaGraphRunner.capture       AROUND  capture BASE into target decode graphs
  CPUGraphRunner.__init__             BEFORE  refuse SGLang's torch.compile CPU graphs
  ForwardBatch.init_new               AFTER   per-token budgets of a decode batch
  ModelRunner._forward_raw            AROUND  fill the buffer (padding -1), open the decode gate
  TopK.forward_cuda/native/cpu        AROUND  select experts (Triton kernels or the torch core); a
                                              folded gate's [T, 2E] output split (plugin/fold.py)
Supported: SGLang 0.5.17 through 0.5.23 (every target above exists in both with the same
signature; what else differs, and how the hooks tell, is in plugin/compat.py).
"""

from __future__ import annotations

from . import hooks

_SRT = "sglang.srt"
TARGETS = (  # (target, hook, hook type name)
    (f"{_SRT}.server_args.ServerArgs.check_server_args", hooks.before_check_server_args,
     "BEFORE"),
    (f"{_SRT}.managers.tokenizer_manager.TokenizerManager.generate_request",
     hooks.before_generate_request, "BEFORE"),
    (f"{_SRT}.model_executor.model_runner.ModelRunner.load_model", hooks.after_load_model, "AFTER"),
    (f"{_SRT}.model_executor.model_runner.ModelRunner.init_cuda_graphs",
     hooks.before_init_cuda_graphs, "BEFORE"),
    (f"{_SRT}.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
     hooks.around_decode_capture, "AROUND"),
    (f"{_SRT}.model_executor.cpu_graph_runner.CPUGraphRunner.__init__", hooks.before_cpu_graph,
     "BEFORE"),
    (f"{_SRT}.model_executor.forward_batch_info.ForwardBatch.init_new",
     hooks.after_forward_batch_init, "AFTER"),
    (f"{_SRT}.model_executor.model_runner.ModelRunner._forward_raw", hooks.around_forward_raw,
     "AROUND"),
    (f"{_SRT}.layers.moe.topk.TopK.forward_cuda", hooks.around_topk, "AROUND"),
    (f"{_SRT}.layers.moe.topk.TopK.forward_native", hooks.around_topk, "AROUND"),
    (f"{_SRT}.layers.moe.topk.TopK.forward_cpu", hooks.around_topk, "AROUND"),
    (f"{_SRT}.layers.moe.moe_runner.triton_utils.fused_moe.fused_experts_impl",
     hooks.around_fused_experts, "AROUND"),
)


def register() -> None:
    """Register every BASE hook with SGLang's HookRegistry (load_plugins applies them)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .config import PluginConfig
    from .state import STATE

    try:
        STATE.config = PluginConfig.from_env()
    except ValueError as exc:  # load_plugins would log and skip us: fail at startup instead
        STATE.config_error = f"BASE plugin: {exc}"
    for target, hook, kind in TARGETS:
        HookRegistry.register(target, hook, HookType[kind])


def revert() -> list[str]:
    """Undo what `register()` + `apply_hooks()` did (tests, notebooks); returns the targets restored.

    Only targets that carry BASE's hooks alone are restored; a target shared with another plugin's
    hooks is left as it is (HookRegistry cannot unwrap one hook out of a chain).
    """
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry, _propagate_patch

    ours = {id(hook) for _, hook, _ in TARGETS}
    restored = []
    for target, _, _ in TARGETS:
        hooks_on = HookRegistry._hooks.get(target, [])
        if not hooks_on or any(id(h) not in ours for _, h, _ in hooks_on):
            continue
        HookRegistry._hooks.pop(target)
        if target in HookRegistry._patched:
            owner_path, attr = target.rsplit(".", 1)
            owner = pkgutil.resolve_name(owner_path)
            raw = owner.__dict__[attr]
            wrapper = raw.__func__ if isinstance(raw, classmethod) else raw
            original = wrapper.__wrapped__
            setattr(owner, attr, classmethod(original) if isinstance(raw, classmethod) else original)
            _propagate_patch(wrapper, original, owner)
            HookRegistry._patched.discard(target)
        restored.append(target)
    return restored
