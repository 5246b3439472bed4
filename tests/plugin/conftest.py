"""Fixtures for the SGLang plugin tests: the real sglang package, plugins loaded once.

The plugin supports sglang 0.5.17 through 0.5.23; tests/run.sh runs this folder against both ends
(sglang installed without its GPU dependencies: tests/plugin/sglang-cpu-requirements.txt for
0.5.23, sglang-0.5.17-cpu-requirements.txt for 0.5.17); without sglang it is skipped.
sglang's import takes ~15 s, so every test shares one process-wide `load_plugins()`.
"""

from __future__ import annotations

import os

import pytest

from base_sglang.core import Predictor

SUPPORTED = ((0, 5, 17), (0, 5, 23))  # first and last supported release


def _sglang_missing() -> str | None:
    try:
        import sglang
    except ImportError as exc:
        return (f"sglang is not importable here ({exc}); see "
                "tests/plugin/sglang-cpu-requirements.txt")
    version = tuple(int(x) for x in sglang.__version__.split(".")[:3])
    if not SUPPORTED[0] <= version <= SUPPORTED[1]:
        return f"the plugin supports sglang 0.5.17 through 0.5.23, found {sglang.__version__}"
    return None


SKIP_REASON = _sglang_missing()


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here):
            item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


from plugin_helpers import DEFAULT_BUDGET, make_predictor  # noqa: E402


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
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    from base_sglang.plugin.compat import publish_process_config

    server_args = ServerArgs(model_path="dummy", device="cpu")
    publish_process_config(server_args)
    yield server_args
    runtime_context.reset_context()


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
