"""The engine's default policy is core.DEFAULT_POLICY (base_plus); the paper's BASE stays `base`."""

import pytest
import torch

from base_sglang.core import DEFAULT_POLICY, SelectionConfig, select_experts
from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams
from base_sglang.hf import decode_step


@pytest.fixture(scope="module")
def default_engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir)))  # no policy given


def test_engine_config_defaults_to_base_plus():
    assert EngineConfig().policy == DEFAULT_POLICY == "base_plus"
    assert EngineConfig(policy="base").policy == "base"


@torch.inference_mode()
def test_default_decode_combines_changed_rows_with_the_partial_rule(default_engine):
    """A decode step of the default engine: BASE's ids, base_plus's partial weights on the rows
    whose experts changed (differing from BASE's renormalised weights), unchanged rows as routed."""
    runner = default_engine.runner
    assert runner.patch.config == SelectionConfig(policy="base_plus", renorm="native")
    assert runner.patch.norm_topk  # the tiny Qwen3-MoE renormalises its top-k
    layer_id = runner.moe_layers[0]
    block = runner.patch.blocks[layer_id]
    routed_gate = runner.patch._originals[layer_id][0]  # the model's own router
    T = 6
    x = torch.randn(T, runner.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    logits, w, ids = routed_gate(x)  # [T, E], [T, K], [T, K]
    budget = torch.full((T,), 1)
    with decode_step(budget):
        _, got_w, got_ids = block.gate(x)  # through the engine's patched router
    want = {p: select_experts(logits, ids, w, x, budget, layer_id, SelectionConfig(policy=p),
                              runner.predictor, norm_topk_prob=True) for p in ("base_plus", "base")}
    assert torch.equal(got_ids, want["base_plus"].ids) and torch.equal(got_ids, want["base"].ids)
    torch.testing.assert_close(got_w, want["base_plus"].weights, rtol=0, atol=0)
    changed = (got_ids != ids).any(1)  # [T]
    assert changed.all()  # budget 1 of top-2 routing changes every row
    # budget 1: one kept expert, routed (own weight w) or backfilled (p scaled by W / p_routed);
    # partial: that weight times (W / weight) ** 0.5 = sqrt(weight * W); BASE renormalises to W
    p = torch.softmax(logits.float(), -1)  # [T, E]
    W = w.sum(1)  # [T]
    slot = got_ids[:, 0]  # [T] the only kept expert of each row
    own = (ids == slot[:, None])  # [T, K]
    never = torch.where(own.any(1), (w * own).sum(1),
                        p.gather(1, slot[:, None])[:, 0] * W / p.gather(1, ids).sum(1))  # [T]
    torch.testing.assert_close(got_w[:, 0], (never * W).sqrt(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(want["base"].weights[:, 0], W, rtol=1e-6, atol=1e-7)
    assert (got_w[:, 0] < W - 1e-4).any()  # base_plus really differs from base


def test_default_engine_generates_within_budget(default_engine):
    default_engine.generate(["Hello, world!", "def add(a, b):"],
                            SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), budget=1)
    steps = [s for s in default_engine.stats.decode_steps()][-3:]
    assert steps and all(max(s.experts_executed) <= 1 for s in steps)
