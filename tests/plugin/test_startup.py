"""Startup: unsupported SGLang settings are refused, the predictor is validated against the model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from plugin_helpers import E, make_predictor, model_runner, tiny_hf_config

from base_sglang.core import DEFAULT_POLICY, PredictorMismatch, SelectionConfig
from base_sglang.plugin import hooks, state
from base_sglang.plugin.checks import UnsupportedConfig
from base_sglang.plugin.config import PluginConfig


def _server_args(**fields):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="dummy", device="cpu", **fields)


@pytest.mark.parametrize("fields, flag", [
    (dict(ep_size=2, tp_size=2), "--ep-size 2"),
    (dict(moe_a2a_backend="deepep"), "--moe-a2a-backend deepep"),
    (dict(enable_dp_attention=True, dp_size=2, tp_size=2), "--enable-dp-attention"),
    (dict(enable_eplb=True, ep_size=2, tp_size=2), "--enable-eplb"),
    (dict(moe_runner_backend="flashinfer_cutlass"), "--moe-runner-backend flashinfer_cutlass"),
    (dict(speculative_algorithm="EAGLE"), "--speculative-algorithm EAGLE"),
    (dict(tokenizer_worker_num=2), "--tokenizer-worker-num 2"),
    (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
])
def test_unsupported_settings_stop_startup(plugin_env, fields, flag):
    """Engine / launch_server call ServerArgs.check_server_args before starting any process."""
    with pytest.raises(UnsupportedConfig, match=flag.replace("-", r"\-")):
        _server_args(**fields).check_server_args()


def test_supported_settings_pass(plugin_env):
    args = _server_args(moe_runner_backend="triton", tp_size=2)
    assert hooks.before_check_server_args(args) is None
    # past our hook, sglang's own check runs (it cannot finish on a "dummy" model here)
    with pytest.raises(Exception) as info:
        args.check_server_args()
    assert not isinstance(info.value, UnsupportedConfig)


def test_settings_are_not_checked_without_a_predictor(plugin_env):
    config = state.STATE.config
    state.STATE.config = PluginConfig()  # BASE_PREDICTOR unset: the plugin stays out of the way
    try:
        assert hooks.before_check_server_args(_server_args(ep_size=2, tp_size=2)) is None
    finally:
        state.STATE.config = config


def _runner(hf_config, **overrides):
    """ModelRunner stand-in after its load_model: model, model_config, server_args, device."""
    fields = dict(model=torch.nn.Linear(1, 1), server_args=_server_args(),
                  model_config=SimpleNamespace(hf_text_config=hf_config))
    fields.update(overrides)
    return model_runner(**fields)


def test_predictor_loaded_and_validated_after_model_load(base_state):
    config = base_state.config
    state.reset()
    state.STATE.config = config
    assert not state.STATE.enabled
    hooks.after_load_model(None, _runner(tiny_hf_config()))
    st = state.STATE
    assert st.enabled and st.num_experts == E and st.predictor.meta.moe_layers == [0, 1]
    torch.testing.assert_close(st.predictor.weight, make_predictor().weight)  # the BASE_PREDICTOR file
    hooks.before_init_cuda_graphs(_runner(tiny_hf_config(), max_running_requests=48))
    assert st.budget.numel() == 48 and st.budget.dtype == torch.int32 and (st.budget == -1).all()


def test_draft_model_load_leaves_the_plugin_alone(base_state):
    config = base_state.config
    state.reset()
    state.STATE.config = config
    hooks.after_load_model(None, _runner(tiny_hf_config(num_experts=3), is_draft_worker=True))
    assert not state.STATE.enabled


@pytest.mark.parametrize("num_experts, field", [(16, "num_experts")])
def test_predictor_mismatch_stops_startup_naming_the_field(base_state, num_experts, field):
    with pytest.raises(PredictorMismatch, match=f"'{field}' = {E} but the model has {num_experts}"):
        hooks.after_load_model(None, _runner(tiny_hf_config(num_experts=num_experts)))


def test_hidden_size_mismatch_is_named(base_state):
    cfg = tiny_hf_config()
    cfg.hidden_size = 32
    with pytest.raises(PredictorMismatch, match="BASE_PREDICTOR=.*'hidden_size'"):
        hooks.after_load_model(None, _runner(cfg))


def test_missing_predictor_file_stops_startup(base_state, tmp_path):
    state.STATE.config = PluginConfig(predictor=str(tmp_path / "nope.safetensors"))
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        hooks.after_load_model(None, _runner(tiny_hf_config()))


def test_default_policy_is_base_plus_and_base_stays_selectable(base_state):
    """Empty environment: base_plus (core.DEFAULT_POLICY); BASE_POLICY=base is the paper's BASE."""
    assert PluginConfig.from_env({}).policy == DEFAULT_POLICY == "base_plus"
    assert PluginConfig.from_env({"BASE_POLICY": " "}).policy == DEFAULT_POLICY
    assert PluginConfig().policy == DEFAULT_POLICY
    paper = PluginConfig.from_env({"BASE_POLICY": "base", "BASE_PREDICTOR": "x"})
    assert paper.policy == "base"
    st = state.PluginState()
    st.enable(base_state.predictor, paper, "cpu")
    assert st.selection == SelectionConfig(policy="base", renorm="native")
    assert st.selection.combine_mode(True) == "always" and st.selection.combine_mode(False) == "never"
    st.enable(base_state.predictor, PluginConfig(predictor="x"), "cpu")
    assert st.selection.policy == "base_plus" and st.selection.combine_mode(True) == "partial"


def test_moe_max_rows_is_read_from_the_environment():
    from base_sglang.plugin import moe

    assert PluginConfig.from_env({}).moe_max_rows == moe.OURS_MAX_TOKENS == 64
    assert PluginConfig.from_env({"BASE_MOE_MAX_ROWS": " 128 "}).moe_max_rows == 128
    assert PluginConfig.from_env({"BASE_MOE_MAX_ROWS": ""}).moe_max_rows == 64


@pytest.mark.parametrize("env, name", [
    ({"BASE_DEFAULT_BUDGET": "0"}, "BASE_DEFAULT_BUDGET"),
    ({"BASE_POLICY": "fastest"}, "policy"),
    ({"BASE_KERNELS": "maybe"}, "BASE_KERNELS"),
    ({"BASE_STATS_INTERVAL": "-3"}, "BASE_STATS_INTERVAL"),
    ({"BASE_MOE_MAX_ROWS": "0"}, "BASE_MOE_MAX_ROWS"),
    ({"BASE_MOE_MAX_ROWS": "sixty"}, "BASE_MOE_MAX_ROWS"),
    ({"BASE_MOE_MAX_ROWS": "5000"}, "BASE_MOE_MAX_ROWS"),
])
def test_bad_environment_is_named(env, name):
    with pytest.raises(ValueError, match=name):
        PluginConfig.from_env(env)


def test_bad_environment_fails_startup_not_silently(base_state):
    """load_plugins() swallows exceptions from register(); the error must surface at startup."""
    state.STATE.config_error = "BASE plugin: BASE_DEFAULT_BUDGET: must be an integer"
    try:
        with pytest.raises(ValueError, match="BASE_DEFAULT_BUDGET"):
            _server_args().check_server_args()
        with pytest.raises(ValueError, match="BASE_DEFAULT_BUDGET"):
            hooks.after_load_model(None, _runner(tiny_hf_config()))
    finally:
        state.STATE.config_error = None


def test_cpu_graph_runner_is_refused(base_state):
    from sglang.srt.model_executor.cpu_graph_runner import CPUGraphRunner

    with pytest.raises(UnsupportedConfig, match="--cuda-graph-backend-decode disabled"):
        CPUGraphRunner(model_runner())  # the real class: the hook refuses before its __init__ runs
    assert hooks.before_cpu_graph(None, model_runner(is_draft_worker=True)) is None


def _moe_block(backend):
    """A MoE block as SGLang builds it: a real TopK and an experts layer whose quant method holds a
    real MoeRunner; the TopK bound to the runner's backend where SGLang does that (0.5.23)."""
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.runner import MoeRunner
    from sglang.srt.layers.moe.topk import TopK

    block = torch.nn.Module()
    block.topk = TopK(top_k=2, layer_id=0)
    if hasattr(block.topk, "bind_runner_backend"):
        block.topk.bind_runner_backend(backend)
    block.experts = torch.nn.Module()
    block.experts.quant_method = SimpleNamespace(runner=MoeRunner(backend, MoeRunnerConfig(
        num_experts=E, num_local_experts=E, hidden_size=16, intermediate_size_per_partition=8,
        top_k=2, params_dtype=torch.float32)))
    model = torch.nn.Module()
    model.moe = block
    return model


def test_non_triton_moe_runner_is_refused_naming_the_layer(published):
    """check_model_runners reads the backend where this sglang keeps it (plugin/compat.py)."""
    from sglang.srt.layers.moe.topk import TopKConfig
    from sglang.srt.layers.moe.utils import MoeRunnerBackend

    from base_sglang.plugin.checks import check_model_runners
    from base_sglang.plugin.compat import moe_runner_backends

    triton, deep_gemm = _moe_block(MoeRunnerBackend.TRITON), _moe_block(MoeRunnerBackend.DEEP_GEMM)
    where = "moe.topk" if "runner_backend" in TopKConfig.__dataclass_fields__ else "moe.experts"
    assert list(moe_runner_backends(triton)) == [(where, MoeRunnerBackend.TRITON)]
    check_model_runners(triton, "cuda")
    with pytest.raises(UnsupportedConfig, match=f"{where} runs on .*--moe-runner-backend triton"):
        check_model_runners(deep_gemm, "cuda")
    check_model_runners(deep_gemm, "cpu")  # the CPU path runs SGLang's torch-native MoE


def test_shared_expert_columns_of_a_real_topk(published):
    from sglang.srt.layers.moe.topk import TopK

    from base_sglang.plugin.compat import shared_topk_columns

    cfg = TopK(top_k=2, layer_id=0).topk_config
    assert shared_topk_columns(cfg) == 0 and cfg.top_k == 2
    cfg_17 = SimpleNamespace(top_k=9, num_fused_shared_experts=1)  # 0.5.17's field name
    assert shared_topk_columns(cfg_17) == 1
