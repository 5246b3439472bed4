"""Error-targeted budgets in the native engine: {"max_error": eps, "max_experts": N} per request.

The engine resolves the request form once (LLMEngine.add_request / AsyncLLMEngine.generate), the
sequence carries (cap, eps), and the model runner builds the per-row bound tensor [B] (NaN = none)
for decode_step; a bounded row never lets the runner skip selection on its cap alone.
"""

import asyncio

import pytest

from base_sglang.engine import AsyncLLMEngine, EngineConfig, LLMEngine, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = ["hello world", "the cat sat on", "one two three four five"]


def _run_together(engine, requests):
    """Add every (prompt, budget) at once and run them to the end; -> (outputs by request, the
    decode steps that ran all of them together)."""
    first = len(engine.stats.decode_steps())
    rids = [engine.add_request(p, GREEDY, b) for p, b in requests]
    last = {}
    while engine.has_unfinished():
        for out in engine.step():
            last.setdefault(out.request_id, []).extend(out.token_ids)
    steps = [s for s in engine.stats.decode_steps()[first:] if s.batch_size == len(requests)]
    assert steps, "the requests never decoded in one batch"
    return [last[r] for r in rids], steps


def test_bound_zero_is_exactly_the_dense_greedy_output(engine):
    dense = [ids for ids, _, _ in engine.generate(PROMPTS, GREEDY, "dense")]
    alone = [engine.generate([p], GREEDY, {"max_error": 0.0})[0][0] for p in PROMPTS]
    batched = [ids for ids, _, _ in engine.generate(PROMPTS, GREEDY, {"max_error": 0})]
    assert alone == dense and batched == dense


def test_bound_one_runs_one_expert_per_layer(engine):
    """eps = 1 asks for M = 1 whatever the cap: alone in its batch, with its cap E (which alone
    would let the runner skip selection), every MoE layer of every step executes one expert."""
    for budget in ({"max_error": 1.0, "max_experts": 1}, {"max_error": 1.0}):
        first = len(engine.stats.decode_steps())
        [(ids, _, out)] = engine.generate([PROMPTS[0]], GREEDY, budget)
        steps = engine.stats.decode_steps()[first:]
        assert len(ids) == GREEDY.max_tokens and len(steps) == GREEDY.max_tokens - 1
        assert all(s.experts_executed == (1, 1) for s in steps)
        assert max(s.experts_routed for s in steps) > (1, 1)  # it had more than one to drop
        assert out.experts_per_layer == 1.0
        assert out.budget == budget.get("max_experts", engine.num_experts)  # the cap


def test_a_mixed_batch_runs_its_largest_request(engine):
    """The step's M is the largest request of its rows: a bounded row asking for 1 expert next to
    int budgets 2 and 3 runs M = 3; a bound capped at 2 next to budget-1 rows runs at most 2; a
    dense row makes the whole step dense (the runner skips selection then)."""
    _, steps = _run_together(engine, [(PROMPTS[0], {"max_error": 1.0}), (PROMPTS[1], 2),
                                      (PROMPTS[2], 3)])
    assert all(e == min(3, r) for s in steps for e, r in zip(s.experts_executed, s.experts_routed))

    _, steps = _run_together(engine, [(PROMPTS[0], {"max_error": 0.0, "max_experts": 2}),
                                      (PROMPTS[1], 1), (PROMPTS[2], 1)])
    assert all(1 <= e <= 2 for s in steps for e in s.experts_executed)
    assert any(e == 2 for s in steps for e in s.experts_executed)  # eps = 0 wants more than 1

    _, steps = _run_together(engine, [(PROMPTS[0], {"max_error": 1.0}), (PROMPTS[1], "dense")])
    assert all(s.experts_executed == s.experts_routed for s in steps)


def test_bounded_and_unbounded_rows_keep_their_own_results(engine):
    """A bounded row (eps = 0) next to rows of budget 1 gets its dense tokens only if its experts
    survive: eps = 0 keeps every expert it routes to, so it matches its dense run exactly."""
    dense = engine.generate([PROMPTS[0]], GREEDY, "dense")[0][0]
    outs, _ = _run_together(engine, [(PROMPTS[0], {"max_error": 0.0}), (PROMPTS[1], 1)])
    assert outs[0] == dense


@pytest.mark.parametrize("budget, field", [
    ({"max_error": 1.5}, "expert_budget.max_error"),
    ({"max_error": -0.1}, "expert_budget.max_error"),
    ({"max_error": float("nan")}, "expert_budget.max_error"),
    ({"max_error": "0.1"}, "expert_budget.max_error"),
    ({"max_error": True}, "expert_budget.max_error"),
    ({"max_experts": 3}, "expert_budget.max_error"),
    ({"max_error": 0.1, "max_experts": 0}, "expert_budget.max_experts"),
    ({"max_error": 0.1, "max_experts": 9}, "expert_budget.max_experts"),
    ({"max_error": 0.1, "max_experts": 2.0}, "expert_budget.max_experts"),
    ({"max_error": 0.1, "extra": 1}, "expert_budget"),
])
def test_bad_bounds_are_refused_naming_the_field(engine, budget, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        engine.add_request(PROMPTS[0], GREEDY, budget)
    assert not engine.has_unfinished()


def test_max_error_beside_an_int_budget(engine):
    rid = engine.add_request(PROMPTS[0], GREEDY, 3, max_error=0.25)
    [seq] = engine.scheduler.waiting[-1]
    assert (seq.request_id, seq.budget, seq.max_error) == (rid, 3, 0.25)
    engine.abort(rid)
    with pytest.raises(ValueError, match="^expert_budget: max_error is given twice"):
        engine.add_request(PROMPTS[0], GREEDY, {"max_error": 0.1}, max_error=0.1)


def test_a_policy_without_removal_cost_refuses_bounds(tiny_model_dir):
    eng = LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="gate_sum"))
    with pytest.raises(ValueError, match="^expert_budget.max_error: .*base_plus, base, oracle"):
        eng.add_request(PROMPTS[0], GREEDY, {"max_error": 0.1})
    assert eng.add_request(PROMPTS[0], GREEDY, 2)  # expert counts still work


def test_the_async_engine_takes_the_same_shapes(engine):
    async def run():
        front = AsyncLLMEngine(engine)
        front.start()
        try:
            with pytest.raises(ValueError, match="^expert_budget.max_error"):
                front.generate(engine.tokenizer.encode(PROMPTS[0]), GREEDY, {"max_error": 2},
                               "bad")
            outs = [o async for o in front.generate(engine.tokenizer.encode(PROMPTS[0]), GREEDY,
                                                    {"max_error": 1, "max_experts": 1}, "r1")]
        finally:
            front.stop()
        return outs

    outs = asyncio.run(run())
    assert outs[-1].finished and outs[-1].experts_per_layer == 1.0 and outs[-1].budget == 1
