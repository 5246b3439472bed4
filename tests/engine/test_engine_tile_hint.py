"""The native engine tells the expert kernel the step's largest budget (a tile hint for fused_moe's
"budget" rows) when every row is budgeted below E, and nothing when a row is dense."""

from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams


def test_decode_step_carries_the_largest_budget(tiny_model_dir):
    eng = LLMEngine(EngineConfig(model=str(tiny_model_dir), max_running_requests=4))
    E = eng.runner.num_experts
    for budget in (2, 3):
        eng.add_request("Hello there", SamplingParams(max_tokens=8, ignore_eos=True), budget)
    eng.step()  # the prefill of both
    seqs = list(eng.scheduler.running)
    assert sorted(s.budget for s in seqs) == [2, 3]
    _, step = eng.runner.decode(seqs)
    assert step.max_experts == 3
    seqs[0].budget = E  # a dense row: no bound
    _, step = eng.runner.decode(seqs)
    assert step.max_experts is None
