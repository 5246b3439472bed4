"""The native engine against plain transformers, and its batching and budget rules."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from base_sglang.engine import EngineConfig, LLMEngine, QueueFull, SamplingParams
from base_sglang.hf import FAMILIES
from base_sglang.testing.models import create_tiny_moe

PROMPTS = ["Hello, world!", "The quick brown fox jumps", "def add(a, b):\n    return",
           "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12"]
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def hf_greedy(model_dir, tokenizer, prompt, n):
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def test_dense_greedy_equals_transformers_generate(engine, tiny_model_dir):
    results = engine.generate(PROMPTS, GREEDY, budget="dense")  # one left-padded batch of 4
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    for prompt, (ids, text, last) in zip(PROMPTS, results):
        enc = engine.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(enc, max_new_tokens=8, do_sample=False)[0, enc.shape[1]:].tolist()
        assert ids == ref
        assert text == engine.tokenizer.decode(ids, skip_special_tokens=True)
        assert last.finished and last.finish_reason in ("length", "stop")
        assert last.budget == engine.num_experts  # dense is reported as E
        assert last.experts_per_layer == pytest.approx(last.experts_per_layer_routed)


@pytest.mark.parametrize("arch", [a for a in FAMILIES if a != "qwen3_moe"])
def test_other_architectures_dense_match(arch, tmp_path):
    path = create_tiny_moe(tmp_path / arch, arch=arch, num_layers=1)
    eng = LLMEngine(EngineConfig(model=str(path), policy="base"))
    prompts = PROMPTS[:2]
    results = eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4), budget="dense")
    for prompt, (ids, _, _) in zip(prompts, results):
        assert ids == hf_greedy(path, eng.tokenizer, prompt, 4)
    small = eng.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4), budget=1)
    steps = eng.stats.decode_steps()
    assert all(max(s.experts_executed) <= s.batch_budget for s in steps)
    assert any(s.batch_budget == 1 and max(s.experts_executed) == 1 for s in steps)
    assert all(len(ids) == 4 or last.finish_reason == "stop" for ids, _, last in small)


def test_batch_budget_bounds_experts_executed(engine):
    """Mixed budgets in one batch: M = the largest; a dense row makes the step dense."""
    E = engine.num_experts
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    start = len(engine.stats.recent)
    for budget in (1, 2, 3):
        engine.add_request(PROMPTS[budget], params, budget)
    _drain(engine)
    steps = [s for s in list(engine.stats.recent)[start:] if not s.is_prefill]
    assert steps and steps[0].budgets == (1, 2, 3) and steps[0].batch_budget == 3
    for s in steps:
        assert s.batch_budget == max(s.budgets)
        assert all(n <= s.batch_budget for n in s.experts_executed)
        assert all(e <= r for e, r in zip(s.experts_executed, s.experts_routed))
    assert any(r > s.batch_budget for s in steps for r in s.experts_routed)  # selection did cut
    start = len(engine.stats.recent)
    engine.add_request(PROMPTS[0], params, 1)
    engine.add_request(PROMPTS[1], params, "dense")
    _drain(engine)
    for s in (s for s in list(engine.stats.recent)[start:] if not s.is_prefill):
        assert s.budgets == (1, E) and s.batch_budget == E
        assert s.experts_executed == s.experts_routed  # dense for everyone
        assert s.removed_cost == 0.0


def test_continuous_batching_matches_solo_runs(engine):
    """Requests joining and leaving a running batch get exactly their solo greedy output."""
    lengths = [3, 9, 5, 7]
    solo = [engine.generate([p], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                            budget="dense")[0][0] for p, n in zip(PROMPTS, lengths)]
    got: dict[str, list[int]] = {}
    rids = [engine.add_request(PROMPTS[i], SamplingParams(temperature=0.0, max_tokens=lengths[i],
                                                          ignore_eos=True), "dense") for i in (0, 1)]
    sizes = []
    for step in range(40):
        if step == 2:  # two more join mid-flight, the short first one leaves meanwhile
            rids += [engine.add_request(PROMPTS[i], SamplingParams(
                temperature=0.0, max_tokens=lengths[i], ignore_eos=True), "dense") for i in (2, 3)]
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
        sizes.append(len(engine.scheduler.running))
        if not engine.has_unfinished():
            break
    assert [got[r] for r in rids] == solo
    assert sizes[:3] == [2, 2, 4] and 3 in sizes[3:]  # joined mid-flight, then one retired
    assert sizes[-1] == 0 and engine.runner.kv.num_rows == 0 and engine.runner.kv.cache is None


def test_seeded_sampling_is_reproducible(engine):
    p = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_tokens=8, seed=1234,
                       ignore_eos=True)
    a = engine.generate([PROMPTS[0]], p)[0][0]
    b = engine.generate([PROMPTS[0], PROMPTS[1]], p)[0][0]  # batched with another request
    c = engine.generate([PROMPTS[0]], SamplingParams(**{**p.__dict__, "seed": 99}))[0][0]
    assert a == b and a != c
    greedy = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=8,
                                                          ignore_eos=True))[0][0]
    top1 = engine.generate([PROMPTS[0]], SamplingParams(temperature=1.0, top_k=1, max_tokens=8,
                                                        ignore_eos=True, seed=5))[0][0]
    assert top1 == greedy


def test_stop_string_truncates_and_finishes(engine):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids, text, _ = engine.generate([PROMPTS[2]], params, budget="dense")[0]
    stop = text[3:5] if len(text) >= 5 else text[-1:]
    assert stop
    _, cut, last = engine.generate([PROMPTS[2]], SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, stop=(stop,)), budget="dense")[0]
    assert cut == text[:text.find(stop)] and last.finish_reason == "stop"


def test_prompt_logprobs_match_model(engine, tiny_model_dir):
    params = SamplingParams(temperature=0.0, max_tokens=0, prompt_logprobs=2)
    rid = engine.add_request(PROMPTS[3], params)
    outs = _drain(engine)
    [out] = [o for o in outs if o.request_id == rid]
    assert out.finished and out.token_ids == [] and out.num_output_tokens == 0
    ids = engine.tokenizer.encode(PROMPTS[3])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    lps = out.prompt_logprobs
    assert lps[0] is None and len(lps) == len(ids)
    for t in range(1, len(ids)):
        assert lps[t].token_id == ids[t]
        assert lps[t].logprob == pytest.approx(ref[t - 1, ids[t]].item(), abs=1e-4)
        assert list(lps[t].top) == ref[t - 1].topk(2).indices.tolist()


def test_queue_is_bounded_and_abort_frees_the_row(tiny_model_dir):
    eng = LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="gate_sum",
                                 max_running_requests=2, max_waiting_requests=2))
    long = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    rids = [eng.add_request(PROMPTS[i], long, 2) for i in range(2)]
    eng.step()  # both admitted (prefill)
    eng.step()  # one decode step with both rows
    assert eng.runner.kv.num_rows == 2
    eng.add_request(PROMPTS[2], long)
    eng.add_request(PROMPTS[3], long)
    with pytest.raises(QueueFull):
        eng.add_request(PROMPTS[0], long)
    [out] = eng.abort(rids[0])
    assert out.finished and out.finish_reason == "abort"
    assert eng.runner.kv.num_rows == 1 and len(eng.scheduler.running) == 1
    eng.step()  # frees room: a waiting request is admitted
    assert len(eng.scheduler.running) == 2 and eng.runner.kv.num_rows == 2
    assert eng.abort("no-such-request") == []


@pytest.mark.parametrize("field,kwargs", [
    ("temperature", {"temperature": -1.0}), ("top_p", {"top_p": 0.0}),
    ("max_tokens", {"max_tokens": -1}), ("stop", {"stop": ("",)}), ("logprobs", {"logprobs": 99}),
])
def test_sampling_params_name_the_bad_field(field, kwargs):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


def test_add_request_names_the_bad_field(engine):
    with pytest.raises(ValueError, match="^prompt:"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="^prompt:"):
        engine.add_request([10**6], GREEDY)
    with pytest.raises(ValueError, match="^max_tokens:"):
        engine.add_request("hi", SamplingParams(max_tokens=10**6))
    with pytest.raises(ValueError, match="^expert_budget:"):
        engine.add_request("hi", GREEDY, budget=0)


def test_missing_predictor_or_model_is_a_clear_error(tiny_model_dir, tmp_path):
    import shutil

    bare = tmp_path / "nopred"
    shutil.copytree(tiny_model_dir, bare)
    (bare / "predictor.safetensors").unlink()
    with pytest.raises(ValueError, match="^predictor: policy 'base' needs a predictor file"):
        LLMEngine(EngineConfig(model=str(bare), policy="base"))
    assert LLMEngine(EngineConfig(model=str(bare), policy="gate_sum")).runner.predictor is None
    with pytest.raises(ValueError, match="^predictor: policy 'base_sched' needs the 'layer_budget'"):
        LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="base_sched"))
    with pytest.raises(FileNotFoundError, match="^model: "):
        LLMEngine(EngineConfig(model=str(tmp_path / "nothing")))


def _drain(engine):
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    return outs


def test_failed_prefill_fails_only_the_new_request(engine, monkeypatch):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    solo = engine.generate([PROMPTS[0]], params, budget="dense")[0][0]
    rid = engine.add_request(PROMPTS[0], params, "dense")
    got = []
    for out in engine.step() + engine.step():  # prefill, then one decode step
        got += out.token_ids
    original = engine.runner.prefill

    def broken(seqs):
        raise RuntimeError("bad prompt")

    monkeypatch.setattr(engine.runner, "prefill", broken)
    bad = engine.add_request(PROMPTS[1], params, "dense")
    [failed] = engine.step()  # the failed prefill ends its own request, nothing else
    assert failed.request_id == bad and failed.finish_reason == "error"
    assert failed.finished and "error id" in failed.error  # the detail stays in the log
    monkeypatch.setattr(engine.runner, "prefill", original)
    for out in _drain(engine):
        assert out.request_id == rid
        got += out.token_ids
    assert got == solo and engine.runner.kv.num_rows == 0


@pytest.mark.gpu
def test_cuda_engine_dense_matches_generate_and_budget_holds(tiny_model_dir):
    eng = LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="base", device="cuda",
                                 dtype="float32"))
    results = eng.generate(PROMPTS, GREEDY, budget="dense")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).cuda().eval()
    for prompt, (ids, _, _) in zip(PROMPTS, results):
        enc = eng.tokenizer(prompt, return_tensors="pt").input_ids.cuda()
        with torch.no_grad():
            ref = model.generate(enc, max_new_tokens=8, do_sample=False)[0, enc.shape[1]:]
        assert ids == ref.tolist()
    eng.generate(PROMPTS, SamplingParams(temperature=0.7, max_tokens=8, seed=3), budget=2)
    assert all(max(s.experts_executed) <= 2 for s in eng.stats.decode_steps()[-7:])
