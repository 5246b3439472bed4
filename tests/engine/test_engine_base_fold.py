"""base_fold through the native engine: the predictor file must carry ExFold's statistics, and a
decode step runs the core's base_fold selection."""

import shutil

import pytest
import torch

from base_sglang.core import Predictor, SelectionConfig, select_experts
from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams
from base_sglang.hf import decode_step
from base_sglang.testing.predictors import random_predictor


@pytest.fixture(scope="module")
def fold_engine(tiny_model_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-fold") / "m"
    shutil.copytree(tiny_model_dir, d)
    p = Predictor.load(d / "predictor.safetensors")
    m = p.meta
    random_predictor(m.num_experts, m.hidden_size, m.top_k, m.moe_layers, num_layers=m.num_layers,
                     stats=True, architecture=m.architecture, model_id=m.model_id,
                     norm_topk_prob=m.norm_topk_prob).save(d / "predictor.safetensors")
    return LLMEngine(EngineConfig(model=str(d), policy="base_fold"))


def test_missing_exfold_statistics_is_a_clear_error(tiny_model_dir):
    with pytest.raises(ValueError, match="^predictor: policy 'base_fold' needs the 'exfold_coef'"):
        LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="base_fold"))


@torch.inference_mode()
def test_decode_step_runs_the_core_fold(fold_engine):
    runner = fold_engine.runner
    layer_id = runner.moe_layers[0]
    block = runner.patch.blocks[layer_id]
    routed_gate = runner.patch._originals[layer_id][0]
    T = 6
    x = torch.randn(T, runner.model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    logits, w, ids = routed_gate(x)
    budget = torch.full((T,), 2)
    with decode_step(budget):
        _, got_w, got_ids = block.gate(x)
    want = select_experts(logits, ids, w, x, budget, layer_id, SelectionConfig(policy="base_fold"),
                          runner.predictor, norm_topk_prob=True)
    plus = select_experts(logits, ids, w, x, budget, layer_id, SelectionConfig(policy="base_plus"),
                          runner.predictor, norm_topk_prob=True)
    assert torch.equal(got_ids, want.ids)
    torch.testing.assert_close(got_w, want.weights, rtol=0, atol=0)
    assert not torch.equal(want.ids, plus.ids)  # folds, not base_plus's backfill


def test_generates_within_budget(fold_engine):
    outs = fold_engine.generate(["Hello, world!", "def add(a, b):"],
                                SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
                                budget=2)
    assert [len(ids) for ids, _, _ in outs] == [4, 4]
    steps = list(fold_engine.stats.decode_steps())[-3:]
    assert steps and all(max(s.experts_executed) <= 2 for s in steps)
