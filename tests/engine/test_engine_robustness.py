"""The shipped proxy model under budgets below top-k, a seeded random schedule, and injected faults.

These run on every transformers version the project allows (tests/run.sh runs this file in the
main environment, which has what README's install resolves, and again under the lowest allowed
transformers). They are the regression tests of the budgets-below-top-k NaN bug: the engine owns
the expert computation of every slot the selection changes, so no library internals are read.
"""

import math

import pytest
import torch

from base_sglang.engine import DEFAULT_MODEL_DIR, EngineConfig, LLMEngine, SamplingParams
from base_sglang.engine.llm_engine import NON_FINITE
from base_sglang.testing.schedule import check_served, random_schedule, serve_on_engine, token_pool

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").is_file(),
                                reason="the embedded proxy model is not installed")
PROBE = SamplingParams(temperature=0.0, max_tokens=16, logprobs=2, ignore_eos=True)
PROBE_PROMPT = "def fibonacci(n):\n    "


@pytest.fixture(scope="module")
def proxy():
    torch.set_num_threads(1)
    return LLMEngine(EngineConfig(max_running_requests=16, max_waiting_requests=512,
                                  num_threads=1))


def run_one(engine, prompt, params, budget):
    """(token ids, text, logprobs, last output) of one request served alone."""
    rid = engine.add_request(prompt, params, budget)
    ids, text, lps, last = [], "", [], None
    while engine.has_unfinished():
        for out in engine.step():
            assert out.request_id == rid
            ids, text, last = ids + out.token_ids, text + out.text, out
            lps += [lp.logprob for lp in out.logprobs or []]
    return ids, text, lps, last


def solo(engine, prompt=PROBE_PROMPT, params=PROBE, budget="dense"):
    ids, text, lps, last = run_one(engine, prompt, params, budget)
    assert last.error is None
    return ids, text, lps


def test_issue_sequence_budgets_below_top_k(proxy):
    """The reported sequence: one request at a time, sampled then greedy, budgets 1, 2, 3, 4, 8."""
    greedy = {}
    for budget in (1, 2, 3, 4, 8):
        for params in (SamplingParams(temperature=1.0, seed=1, max_tokens=12, logprobs=1),
                       SamplingParams(temperature=0.0, max_tokens=12, logprobs=1)):
            ids, text, lps, last = run_one(proxy, "import os\n", params, budget)
            assert last.error is None and last.finish_reason in ("stop", "length")
            assert ids and len(lps) == len(ids) and all(math.isfinite(x) for x in lps)
            if params.temperature == 0.0:
                greedy[budget] = ids
    for budget, ids in greedy.items():  # identical requests give identical greedy text
        [(again, _, _)] = proxy.generate(["import os\n"], SamplingParams(temperature=0.0,
                                                                          max_tokens=12), budget)
        assert again == ids
    assert len({tuple(v) for v in greedy.values()}) > 1  # the budgets did change the routing


def test_in_process_budget_takes_the_http_values(proxy):
    E = proxy.num_experts
    assert proxy.resolve_budget("dense") == E and proxy.resolve_budget(" 4 ") == 4
    assert proxy.resolve_budget(E) == E and proxy.resolve_budget(None) == proxy.default_budget
    for bad in (0, -1, E + 1, "fast", 2.5, True):
        with pytest.raises(ValueError, match="expert_budget"):
            proxy.add_request("x", PROBE, bad)


def test_random_schedule_every_request_finishes_cleanly(proxy):
    """200+ requests: budgets 1..E and dense mixed in batches, sampling settings, stops, arrivals
    while others decode, aborts. No exception, no NaN, every request ends with its reason; a greedy
    dense request inside the traffic equals itself served alone; the engine is unchanged after."""
    before = solo(proxy)
    pool = token_pool(proxy.tokenizer)
    schedule = random_schedule(pool, proxy.num_experts, proxy.runner.patch.top_k,
                               num_requests=220, seed=1234)
    probe_ids = proxy.tokenizer.encode(PROBE_PROMPT)
    served = serve_on_engine(proxy, schedule)
    assert check_served(served, proxy.eos_ids) == []
    extras = [s.request.extra for s in served.values()]
    for name in ("n", "best_of", "logit_bias", "min_tokens", "stop_token_ids", "schema",
                 "presence_penalty", "repetition_penalty", "min_p"):
        assert any(name in e for e in extras), name  # the schedule exercised every control
    assert any(c.finish_reason == "stop" for s in served.values() if "schema" in s.request.extra
               for c in s.choices.values())  # and some constrained output ran to its end
    reasons = {s.finish_reason for s in served.values()}
    assert {"stop", "length", "abort"} <= reasons
    steps = proxy.stats.decode_steps()
    assert any(s.batch_budget < proxy.runner.patch.top_k and s.batch_size > 1 for s in steps)
    assert any(s.batch_size >= 8 for s in steps)

    # a greedy dense probe arriving mid-traffic gets exactly its solo tokens and logprobs
    mixed = random_schedule(pool, proxy.num_experts, proxy.runner.patch.top_k, num_requests=40,
                            seed=99, arrival_span=20)
    rid, probe = None, []
    for i in range(200):
        if i == 5:
            rid = proxy.add_request(probe_ids, PROBE, "dense", request_id="probe")
        if i < 20:
            for req in (r for r in mixed if r.arrival == i):
                proxy.add_request(req.prompt_ids, SamplingParams(
                    temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
                    max_tokens=req.max_tokens, stop=req.stop, seed=req.seed), req.budget)
        for out in proxy.step():
            if out.request_id == rid:
                assert out.error is None
                probe += [(t, lp.logprob) for t, lp in zip(out.token_ids, out.logprobs)]
        if not proxy.has_unfinished():
            break
    assert [t for t, _ in probe] == before[0]
    assert max(abs(a - b) for (_, a), b in zip(probe, before[2])) < 1e-3

    after = solo(proxy)
    assert after[0] == before[0] and after[1] == before[1]
    assert proxy.runner.kv.num_rows == 0 and not proxy.scheduler.running


def _poison_row(model, layer: int, row: int, on_call: int):
    """A forward hook that turns one row of one decoder layer's output into NaN, once."""
    calls = {"n": 0}

    def hook(module, args, output):
        calls["n"] += 1
        if calls["n"] == on_call:
            hidden = output[0] if isinstance(output, tuple) else output
            hidden[row] = float("nan")
        return output

    return model.model.layers[layer].register_forward_hook(hook)


@pytest.mark.parametrize("budget", [3, "dense"])
def test_nan_row_fails_that_request_alone(proxy, budget):
    prompts = ["import os\n", "The quick brown fox", "SELECT * FROM", "def add(a, b):"]
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=1, ignore_eos=True)
    rids = [proxy.add_request(p, params, budget) for p in prompts]
    outs = proxy.step()  # one prefill of the four
    assert len(outs) == 4
    handle = _poison_row(proxy.runner.model, layer=3, row=1, on_call=2)  # the 2nd decode step
    try:
        results = {r: [] for r in rids}
        while proxy.has_unfinished():
            for out in proxy.step():
                results[out.request_id].append(out)
    finally:
        handle.remove()
    bad = results[rids[1]][-1]
    assert bad.finished and bad.finish_reason == "error" and bad.error == NON_FINITE
    for rid in (rids[0], rids[2], rids[3]):
        last = results[rid][-1]
        assert last.error is None and last.finish_reason == "length"
        assert all(math.isfinite(lp.logprob) for o in results[rid] for lp in o.logprobs or [])
    assert proxy.runner.kv.num_rows == 0
    ids, _, _ = solo(proxy, prompts[1], params, budget)  # the engine state is intact
    assert len(ids) == 8


def test_nan_logits_in_prefill_fail_only_that_request(proxy, monkeypatch):
    runner = proxy.runner
    original = runner.run

    def run(seqs, is_prefill):
        logits, stats = original(seqs, is_prefill)
        if is_prefill and len(seqs) == 2:
            logits = logits.clone()
            logits[0, 5] = float("inf")
        return logits, stats

    monkeypatch.setattr(runner, "run", run)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    a = proxy.add_request("one", params, 2)
    b = proxy.add_request("two", params, 2)
    outs = {}
    while proxy.has_unfinished():
        for out in proxy.step():
            outs.setdefault(out.request_id, []).append(out)
    assert outs[a][-1].finish_reason == "error" and len(outs[a]) == 1
    assert outs[b][-1].finish_reason == "length" and outs[b][-1].num_output_tokens == 3


def test_extreme_sampling_settings_stay_finite(proxy):
    for params in (SamplingParams(temperature=1e-7, max_tokens=4, logprobs=20),
                   SamplingParams(temperature=2.0, top_p=1e-9, max_tokens=4, logprobs=3),
                   SamplingParams(temperature=1.0, top_p=5e-324, max_tokens=4),  # 0 in fp32
                   SamplingParams(temperature=2.0, top_k=1, max_tokens=4)):
        rid = proxy.add_request("x", params, 1)
        while proxy.has_unfinished():
            for out in proxy.step():
                assert out.request_id == rid and out.error is None
                for lp in out.logprobs or []:
                    assert math.isfinite(lp.logprob)
                    assert all(math.isfinite(v) for v in lp.top.values())
