"""Fixtures for the SGLang plugin tests: the real sglang 0.5.23 package, plugins loaded once.

These tests need sglang installed without its GPU dependencies (see
tests/plugin/sglang-cpu-requirements.txt); without it the whole directory is skipped.
sglang's import takes ~15 s, so every test shares one process-wide `load_plugins()`.
"""

from __future__ import annotations

import os

import pytest
import torch

from base_sglang.core import Predictor, PredictorMeta


def _sglang_missing() -> str | None:
    try:
        import sglang
    except ImportError as exc:
        return (f"sglang 0.5.23 is not importable here ({exc}); see "
                "tests/plugin/sglang-cpu-requirements.txt")
    if sglang.__version__ != "0.5.23":
        return f"the plugin is pinned to sglang 0.5.23, found {sglang.__version__}"
    return None


SKIP_REASON = _sglang_missing()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


NUM_LAYERS, E, K, H = 2, 8, 2, 16  # tiny Qwen3-MoE-like shape: 2 MoE layers, 8 experts, top-2
DEFAULT_BUDGET = 5  # BASE_DEFAULT_BUDGET during the tests


def make_predictor(num_experts: int = E, seed: int = 0) -> Predictor:
    g = torch.Generator().manual_seed(seed)
    meta = PredictorMeta(architecture="Qwen3MoeForCausalLM", model_id="tiny-test", num_layers=NUM_LAYERS,
                         moe_layers=list(range(NUM_LAYERS)), hidden_size=H, num_experts=num_experts,
                         top_k=K)
    return Predictor(meta=meta, weight=torch.randn(NUM_LAYERS, num_experts, H, generator=g) * 0.5,
                     bias=torch.randn(NUM_LAYERS, num_experts, generator=g))


def tiny_hf_config(num_experts: int = E):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=H, num_hidden_layers=NUM_LAYERS, num_experts=num_experts,
                          num_experts_per_tok=K, intermediate_size=32, moe_intermediate_size=8,
                          num_attention_heads=2, num_key_value_heads=1, vocab_size=64)


@pytest.fixture(scope="session")
def plugin_env(tmp_path_factory):
    """Write a predictor file, point BASE_* at it, then let sglang load the installed plugins."""
    path = tmp_path_factory.mktemp("plugin") / "predictor.safetensors"
    make_predictor().save(path)
    os.environ.update(SGLANG_PLUGINS="base", BASE_PREDICTOR=str(path),
                      BASE_DEFAULT_BUDGET=str(DEFAULT_BUDGET), BASE_STATS_INTERVAL="0")
    from sglang.srt.layers.moe.topk import TopK
    from sglang.srt.plugins import load_plugins

    import base_sglang.plugin  # noqa: F401  importing alone must patch nothing

    patched_by_import = hasattr(TopK.forward_native, "__wrapped__")
    load_plugins()
    return {"predictor_path": str(path), "patched_by_import": patched_by_import}


@pytest.fixture(scope="session")
def published(plugin_env):
    """SGLang's process topology for a CPU test (what sglang's own test_utils.published_topology does)."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", device="cpu")
    reset_context()
    publish(server_args, role="test", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    yield server_args
    reset_context()


@pytest.fixture
def base_state(plugin_env, published):
    """The plugin's scheduler-side state as after model load: predictor enabled, 16-row buffer."""
    from base_sglang.plugin import state

    config = state.STATE.config
    assert config.enabled and config.default_budget == DEFAULT_BUDGET  # read from BASE_* by register()
    state.reset()
    state.STATE.config = config
    state.STATE.enable(Predictor.load(plugin_env["predictor_path"]), config, "cpu")
    state.STATE.ensure_buffer(16, "cpu")
    yield state.STATE
    state.reset()
    state.STATE.config = config


def model_runner(**overrides):
    """Stand-in for the few ModelRunner attributes the hooks read (a real one needs a GPU model).

    Everything the hooks *do* with it goes through the real sglang classes and the real hook code.
    """
    from types import SimpleNamespace

    fields = dict(is_draft_worker=False, max_running_requests=16, device="cpu")
    fields.update(overrides)
    return SimpleNamespace(**fields)


def forward_batch(mode, batch_size: int):
    """A real sglang ForwardBatch in the given ForwardMode (only the required fields set)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    z = torch.zeros(batch_size, dtype=torch.int64)
    return ForwardBatch(forward_mode=mode, batch_size=batch_size, input_ids=z, req_pool_indices=z,
                        seq_lens=z + 1, out_cache_loc=z, seq_lens_sum=batch_size)
