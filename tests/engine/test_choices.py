"""n choices sharing one prefill, best_of ranking, and the sampling controls through the engine
(tiny random Qwen3-MoE), with transformers' generate as the oracle where it has the control."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from base_sglang.engine import SamplingParams

PROMPT = "The quick brown fox jumps"


def drain(engine):
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs


def test_n_choices_share_one_prefill(engine):
    p = SamplingParams(temperature=1.0, max_tokens=6, seed=11, n=3, ignore_eos=True, logprobs=1)
    start = len(engine.stats.recent)
    choices = engine.generate_choices([PROMPT], p, "dense")[0]
    prefills = [s for s in list(engine.stats.recent)[start:] if s.is_prefill]
    prompt_len = len(engine.tokenizer.encode(PROMPT))
    assert len(prefills) == 1 and prefills[0].batch_size == 3
    assert prefills[0].num_tokens == prompt_len  # the prompt was forwarded once
    assert [last.index for _, _, last in choices] == [0, 1, 2]
    assert len({tuple(ids) for ids, _, _ in choices}) > 1  # the choices sample independently
    for ids, _, last in choices:
        assert len(ids) == 6 and last.finish_reason == "length"
    # choice 0 is what n=1 with the same seed gives; the whole request is reproducible
    solo = engine.generate([PROMPT], SamplingParams(**{**p.__dict__, "n": 1}), "dense")[0][0]
    assert choices[0][0] == solo
    again = engine.generate_choices([PROMPT], p, "dense")[0]
    assert [c[0] for c in again] == [c[0] for c in choices]
    assert engine.runner.kv.num_rows == 0


def test_greedy_n_gives_identical_choices(engine):
    p = SamplingParams(temperature=0.0, max_tokens=8, n=4, ignore_eos=True)
    choices = engine.generate_choices([PROMPT, "def add(a, b):"], p, 2)
    solo = engine.generate([PROMPT, "def add(a, b):"], SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True), 2)
    for per_prompt, (ref, _, _) in zip(choices, solo):
        assert [ids for ids, _, _ in per_prompt] == [ref] * 4


def test_n_choices_match_transformers_prefix_cache_copy(engine, tiny_model_dir):
    """The copied KV row decodes exactly like a fresh one: greedy n=2 == transformers generate."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    enc = engine.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(enc, max_new_tokens=7, do_sample=False)[0, enc.shape[1]:].tolist()
    choices = engine.generate_choices([PROMPT], SamplingParams(temperature=0.0, max_tokens=7, n=2),
                                      "dense")[0]
    for ids, _, _ in choices:
        assert ids == ref[:len(ids)]


def test_best_of_returns_the_n_most_likely_at_the_end(engine):
    base = dict(temperature=1.2, max_tokens=5, seed=5, ignore_eos=True, logprobs=0)
    all4 = engine.generate_choices([PROMPT], SamplingParams(**base, n=4), "dense")[0]
    sums = [sum(lp.logprob for lp in _logprobs_of(engine, PROMPT, base, i)) for i in range(4)]
    rid = engine.add_request(PROMPT, SamplingParams(**base, n=2, best_of=4), "dense")
    outs = [o for o in drain(engine) if o.request_id == rid]
    assert [o.index for o in outs] == [0, 1] and all(o.finished for o in outs)  # one output each
    best = sorted(range(4), key=lambda i: -sums[i])[:2]
    assert [o.token_ids for o in outs] == [all4[i][0] for i in best]
    for o, i in zip(outs, best):
        assert o.cumulative_logprob == pytest.approx(sums[i], abs=1e-4)
        assert len(o.logprobs) == 5 and o.text == all4[i][1]


def _logprobs_of(engine, prompt, base, index):
    """Choice `index`'s token logprobs of an n=4 request (same seeds as best_of=4)."""
    rid = engine.add_request(prompt, SamplingParams(**base, n=4), "dense")
    lps = []
    for out in drain(engine):
        if out.request_id == rid and out.index == index:
            lps += out.logprobs
    return lps


def test_abort_ends_every_choice_and_frees_the_rows(engine):
    p = SamplingParams(temperature=0.7, max_tokens=40, n=3, ignore_eos=True)
    rid = engine.add_request(PROMPT, p, 2)
    other = engine.add_request("def add(a, b):", SamplingParams(temperature=0.0, max_tokens=4), 2)
    engine.step()
    engine.step()
    assert engine.runner.kv.num_rows == 4
    finals = engine.abort(rid)
    assert sorted(o.index for o in finals) == [0, 1, 2]
    assert all(o.finish_reason == "abort" and o.finished for o in finals)
    assert engine.runner.kv.num_rows == 1
    assert any(o.request_id == other and o.finished for o in drain(engine))
    held = engine.add_request(PROMPT, SamplingParams(max_tokens=40, n=2, best_of=3), 2)
    engine.step()
    assert [o.index for o in engine.abort(held)] == [0, 1] and engine.runner.kv.num_rows == 0


def test_more_choices_than_rows_is_a_400(engine):
    with pytest.raises(ValueError, match="^n: 9 choices exceed"):
        engine.add_request(PROMPT, SamplingParams(n=9))
    with pytest.raises(ValueError, match="^best_of: "):
        engine.add_request(PROMPT, SamplingParams(n=2, best_of=9))
    for field, kw in (("logit_bias", {"logit_bias": {10**6: 1}}),
                      ("stop_token_ids", {"stop_token_ids": (10**6,)})):
        with pytest.raises(ValueError, match=f"^{field}: token ids must be in"):
            engine.add_request(PROMPT, SamplingParams(**kw))


def test_non_finite_row_fails_its_request_with_all_choices(engine, monkeypatch):
    runner, original = engine.runner, engine.runner.run
    calls = {"n": 0}

    def run(seqs, is_prefill):
        logits, stats = original(seqs, is_prefill)
        calls["n"] += 1
        if calls["n"] == 3:  # the second decode step: poison row 1 (a choice of `bad`)
            logits = logits.clone()
            logits[1, 0] = float("nan")
        return logits, stats

    monkeypatch.setattr(runner, "run", run)
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    bad = engine.add_request(PROMPT, SamplingParams(**{**params.__dict__, "n": 2}), "dense")
    good = engine.add_request("def add(a, b):", params, "dense")
    outs = drain(engine)
    bad_final = [o for o in outs if o.request_id == bad and o.finished]
    assert sorted(o.index for o in bad_final) == [0, 1]
    assert all(o.finish_reason == "error" and "non-finite" in o.error for o in bad_final)
    [good_final] = [o for o in outs if o.request_id == good and o.finished]
    assert good_final.finish_reason == "length" and good_final.num_output_tokens == 5
    assert engine.runner.kv.num_rows == 0


def test_repetition_penalty_equals_transformers_generate(engine, tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    enc = engine.tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        ref = model.generate(enc, max_new_tokens=10, do_sample=False, repetition_penalty=1.8)
    ours = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=10,
                                                    repetition_penalty=1.8), "dense")[0][0]
    assert ours == ref[0, enc.shape[1]:].tolist()[:len(ours)]
    plain = engine.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=10), "dense")
    assert plain[0][0] != ours  # the penalty changed something on this prompt


def test_stop_token_ids_min_tokens_and_logit_bias(engine):
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    ids = engine.generate([PROMPT], greedy, "dense")[0][0]
    stop = ids[2]
    got, _, last = engine.generate([PROMPT], SamplingParams(
        **{**greedy.__dict__, "stop_token_ids": (stop,)}), "dense")[0]
    assert got == ids[:ids.index(stop) + 1] and last.finish_reason == "stop"  # the id is kept
    late, _, _ = engine.generate([PROMPT], SamplingParams(
        **{**greedy.__dict__, "stop_token_ids": (ids[0],), "min_tokens": 3}), "dense")[0]
    assert ids[0] not in late[:3] and (len(late) == 8 or late[-1] == ids[0])
    banned, _, _ = engine.generate([PROMPT], SamplingParams(
        **{**greedy.__dict__, "logit_bias": {ids[0]: -100}}), "dense")[0]
    assert ids[0] not in banned
    forced, _, _ = engine.generate([PROMPT], SamplingParams(
        **{**greedy.__dict__, "logit_bias": {42: 100}}), "dense")[0]
    assert forced == [42] * 8


def test_penalised_sampling_stays_finite_and_logprobs_are_the_models(engine):
    p = SamplingParams(temperature=0.9, max_tokens=12, seed=1, presence_penalty=2.0,
                       frequency_penalty=2.0, min_p=0.05, logprobs=3, n=2, ignore_eos=True)
    for ids, _, last in engine.generate_choices([PROMPT], p, 3)[0]:
        assert len(ids) == 12 and last.error is None
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=1, logprobs=2,
                                                    logit_bias={42: 100}), "dense")
    [out] = [o for o in drain(engine) if o.request_id == rid]
    assert out.token_ids == [42] and math.isfinite(out.logprobs[0].logprob)
    assert 42 not in out.logprobs[0].top  # the reported logprobs ignore the bias (raw model)


def test_async_stream_ends_after_every_choice(engine):
    import asyncio

    from base_sglang.engine import AsyncLLMEngine

    async def run():
        front = AsyncLLMEngine(engine)
        front.start()
        try:
            ids = engine.tokenizer.encode(PROMPT)
            outs = []
            stream = front.generate(ids, SamplingParams(temperature=0.0, max_tokens=4, n=3,
                                                        ignore_eos=True), "dense", "async-n")
            async for out in stream:
                outs.append(out)
            held = []
            async for out in front.generate(ids, SamplingParams(max_tokens=3, n=2, best_of=3,
                                                                seed=1), "dense", "async-b"):
                held.append(out)
            return outs, held
        finally:
            front.stop()

    outs, held = asyncio.run(run())
    assert sorted(o.index for o in outs if o.finished) == [0, 1, 2]
    assert outs[-1].finished and sum(len(o.token_ids) for o in outs) == 12
    assert [o.index for o in held] == [0, 1] and all(o.finished for o in held)


def test_the_protocol_states_the_engines_choice_seeds_and_json_object():
    """The sglang backend derives choice seeds and json_object from protocol.py (it must not
    import the native engine): the same values as the engine's."""
    from base_sglang import protocol
    from base_sglang.engine import grammar, llm_engine

    assert protocol.SEED_STRIDE == llm_engine.SEED_STRIDE
    assert protocol.JSON_OBJECT_SCHEMA == grammar.JSON_OBJECT_SCHEMA
