"""The embedded proxy ships a base_sched schedule: the engine runs policy base_sched on it out of
the box, and each decode step's experts per layer follow the table of its batch-size range."""

import pytest
import torch

from base_sglang.core import Predictor
from base_sglang.engine import DEFAULT_MODEL_DIR, EngineConfig, LLMEngine, SamplingParams


def test_base_sched_runs_on_the_shipped_proxy():
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("the embedded proxy model is not installed")
    pred = Predictor.load(DEFAULT_MODEL_DIR / "predictor.safetensors")
    assert pred.schedule_bounds == (11, 32) and pred.layer_budget.shape == (3, 8, 65)
    t = pred.layer_budget
    assert torch.equal(t.sum(1), t.shape[1] * torch.arange(65.0).expand(3, 65))  # L * M per M
    torch.set_num_threads(1)
    eng = LLMEngine(EngineConfig(model=str(DEFAULT_MODEL_DIR), policy="base_sched",
                                 max_running_requests=4, num_threads=1))
    for prompt in ("The river", "def f(x):", "Once upon"):
        eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), 8)
    while eng.has_unfinished():
        eng.step()
    steps = eng.stats.decode_steps()
    assert steps and all(s.batch_size == 3 for s in steps)
    row = pred.layer_budget[0, :, 8]  # range 0 (rows 1-11), batch budget 8: [L] per-layer budgets
    assert len(set(row.tolist())) > 1  # the schedule is not uniform at M = 8
    for s in steps:
        want = [min(int(m), r) for m, r in zip(row.tolist(), s.experts_routed)]
        assert list(s.experts_executed) == want, s
