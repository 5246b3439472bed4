"""The native engine under base_sched runs, per decode step, the table of its batch-size range."""

import shutil

import torch

from base_sglang.core import Predictor
from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams

PROMPTS = ["Hello, world!", "The quick brown fox jumps", "def add(a, b):\n    return",
           "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12"]


def test_each_decode_step_runs_the_table_of_its_row_count(tiny_model_dir, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(tiny_model_dir, model)
    pred = Predictor.load(model / "predictor.safetensors")
    E, L = pred.meta.num_experts, len(pred.meta.moe_layers)
    # ranges: 1 row, 2 rows, 3+ rows; at batch budget 1 the first MoE layer runs 1, 3 or 5
    # experts, the second 1 (sums differ: the engine only reads the table)
    table = torch.arange(E + 1, dtype=torch.float32).repeat(3, L, 1)  # [R, L, E+1]
    table[:, 0, 1] = torch.tensor([1.0, 3.0, 5.0])
    pred.layer_budget, pred.layer_budget_max_batch = table, torch.tensor([1.0, 2.0])
    pred.save(model / "predictor.safetensors")
    eng = LLMEngine(EngineConfig(model=str(model), policy="base_sched", max_running_requests=8))
    assert eng.runner.predictor.schedule_bounds == (1, 2)
    for i, prompt in enumerate(PROMPTS):  # 4, 3, 2, then 1 running requests as they finish
        eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3 + 2 * i,
                                               ignore_eos=True), 1)
    while eng.has_unfinished():
        eng.step()
    steps = eng.stats.decode_steps()
    assert {s.batch_size for s in steps} == {1, 2, 3, 4}
    for s in steps:
        r = min(s.batch_size, 3) - 1
        want = [1, 3, 5][r]
        assert s.experts_executed[0] == min(want, s.experts_routed[0]), s
        assert s.experts_executed[1] == 1, s
    assert any(s.experts_executed[0] == 5 for s in steps)  # the 3+ range did run
    assert any(s.batch_size == 2 and s.experts_executed[0] == 3 for s in steps)
