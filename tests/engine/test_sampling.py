"""Logits processing against its definitions (transformers' processors where it has them, else a
per-token loop), SamplingParams validation, and the sampler's guarantees."""

import math

import pytest
import torch
from transformers import MinPLogitsWarper, RepetitionPenaltyLogitsProcessor

from base_sglang.engine.sampler import (
    NO_TOKEN,
    Sampler,
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_penalties,
    draw,
    token_counts,
)
from base_sglang.engine.sequence import Sequence
from base_sglang.protocol import MAX_LOGPROBS, ResponseFormat, SamplingParams

V = 40


def seq(prompt, output=(), **params) -> Sequence:
    s = Sequence("r", list(prompt), SamplingParams(**params), budget=8, detokenizer=None)
    s.output_ids = list(output)
    return s


def test_token_counts():
    c = token_counts([[1, 1, 3], [], [0]], 5, "cpu")
    assert c.tolist() == [[0, 2, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]]


def test_repetition_penalty_equals_transformers():
    torch.manual_seed(0)
    logits = torch.randn(3, V) * 3
    rows = [seq([1, 2, 3], [5, 5, 2], repetition_penalty=1.7),
            seq([7], [], repetition_penalty=0.6),
            seq([4, 9], [9, 30])]  # no penalty: unchanged
    got = apply_penalties(logits.clone(), rows)
    for b, s in enumerate(rows):
        ids = torch.tensor([s.prompt_ids + s.output_ids])
        ref = RepetitionPenaltyLogitsProcessor(s.params.repetition_penalty)(ids, logits[b:b + 1].clone())
        assert torch.allclose(got[b], ref[0]), b


def test_frequency_and_presence_penalties_follow_openai():
    torch.manual_seed(1)
    logits = torch.randn(2, V)
    rows = [seq([1, 2], [3, 3, 3, 4], frequency_penalty=0.5, presence_penalty=1.25),
            seq([3], [], frequency_penalty=-2.0, presence_penalty=2.0)]
    got = apply_penalties(logits.clone(), rows)
    for b, s in enumerate(rows):
        for tok in range(V):
            count = s.output_ids.count(tok)  # the prompt does not count (OpenAI: generated text)
            want = logits[b, tok] - s.params.frequency_penalty * count \
                - s.params.presence_penalty * (count > 0)
            assert got[b, tok].item() == pytest.approx(want.item(), abs=1e-6)


def test_repetition_then_frequency_order_as_vllm():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    s = seq([0], [1, 1], repetition_penalty=2.0, frequency_penalty=0.5)
    got = apply_penalties(logits.clone(), [s])[0].tolist()
    assert got == [1.0, -4.0 - 1.0, 1.0]  # 2/2; -2*2 then -0.5*2; untouched


def test_a_tiny_repetition_penalty_keeps_every_logit_a_number():
    """5e-324 is a valid float64 > 0 but 0 in float32: masked (-inf) logits must not become NaN,
    nor positive ones inf (the server answered 500 for it, schemathesis found it)."""
    logits = torch.tensor([[3.0, -float("inf"), -1.0, 1e30]])
    s = seq([0, 1, 2, 3], repetition_penalty=5e-324)
    got = apply_penalties(logits.clone(), [s])[0]
    assert not got.isnan().any() and got[1] == -float("inf")
    assert torch.isfinite(got[[0, 2, 3]]).all() and got[0] > 1e30
    greedy = Sampler()(logits, [seq([0, 1, 2, 3], temperature=0.0, repetition_penalty=5e-324)])
    assert greedy in ([0], [3])  # never the masked token


def test_logit_bias_adds_per_row_and_minus_100_bans():
    logits = torch.zeros(2, V)
    rows = [seq([1], logit_bias={"3": 100, 5: -100.0}), seq([1])]
    got = apply_logit_bias(logits, rows)
    assert got[0, 3] == 100 and got[0, 5] == -100 and got[1].abs().sum() == 0
    assert got[0].argmax() == 3
    greedy = Sampler()(torch.zeros(1, V), [seq([1], temperature=0.0, logit_bias={7: 5.0})])
    assert greedy == [7]


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = torch.zeros(3, V)
    logits[:, 0] = 10.0  # EOS (id 0) is the favourite
    rows = [seq([1], [4], min_tokens=3, stop_token_ids=(9,)),
            seq([1], [4, 4, 4], min_tokens=3, stop_token_ids=(9,)),  # reached
            seq([1], [], min_tokens=2, ignore_eos=True, stop_token_ids=(9,))]
    got = apply_min_tokens(logits.clone(), rows, frozenset({0}))
    assert got[0, 0] == -math.inf and got[0, 9] == -math.inf and torch.isfinite(got[0, 1:9]).all()
    assert torch.equal(got[1], logits[1])
    assert got[2, 0] == 10.0 and got[2, 9] == -math.inf  # ignore_eos: EOS is no stop token


def test_min_tokens_yields_when_nothing_else_is_left():
    logits = torch.full((1, V), -math.inf)
    logits[0, 0] = 0.0  # e.g. a finished grammar allows only EOS
    got = apply_min_tokens(logits.clone(), [seq([1], [], min_tokens=5)], frozenset({0}))
    assert got[0, 0] == 0.0


def test_min_p_equals_transformers():
    torch.manual_seed(2)
    logits = torch.randn(2, V) * 2
    got = apply_min_p(logits.clone(), torch.tensor([0.2, 0.0]))
    ref = MinPLogitsWarper(0.2)(None, logits[:1].clone())
    assert torch.equal(torch.isfinite(got[0]), torch.isfinite(ref[0]))
    assert torch.equal(got[1], logits[1])


def test_min_p_one_is_greedy_and_dead_rows_get_no_token():
    torch.manual_seed(3)
    logits = torch.randn(4, V)
    rows = [seq([1], temperature=1.5, min_p=1.0, seed=s) for s in range(4)]
    for s in rows:
        s.generator = torch.Generator().manual_seed(0)
    assert Sampler()(logits, rows) == logits.argmax(-1).tolist()
    dead = torch.full((1, V), -math.inf)
    assert Sampler()(dead, [seq([1], temperature=0.0)]) == [NO_TOKEN]
    assert Sampler()(dead, [seq([1], temperature=1.0)]) == [NO_TOKEN]


def test_sampled_rows_without_a_seed_share_one_draw_and_stay_in_the_filter():
    torch.manual_seed(4)
    logits = torch.randn(6, V)
    rows = [seq([1], temperature=1.0, top_k=3) for _ in range(6)]
    for _ in range(20):
        toks = Sampler()(logits, rows)
        top3 = logits.topk(3, -1).indices
        assert all(t in top3[b].tolist() for b, t in enumerate(toks))


@pytest.mark.parametrize("field,kwargs", [
    ("n", {"n": 0}), ("n", {"n": 129}), ("best_of", {"n": 3, "best_of": 2}),
    ("best_of", {"best_of": 200}), ("n", {"n": 1.5}),
    ("logit_bias", {"logit_bias": {"x": 1}}), ("logit_bias", {"logit_bias": {5: 101}}),
    ("logit_bias", {"logit_bias": {-1: 1}}), ("logit_bias", {"logit_bias": [1, 2]}),
    ("logit_bias", {"logit_bias": {5: float("nan")}}),
    ("presence_penalty", {"presence_penalty": 2.5}),
    ("frequency_penalty", {"frequency_penalty": float("nan")}),
    ("repetition_penalty", {"repetition_penalty": 0.0}),
    ("repetition_penalty", {"repetition_penalty": 3.0}),
    ("min_p", {"min_p": -0.1}), ("min_p", {"min_p": 1.5}),
    ("min_tokens", {"min_tokens": -1}), ("min_tokens", {"max_tokens": 4, "min_tokens": 5}),
    ("stop_token_ids", {"stop_token_ids": (-3,)}), ("stop_token_ids", {"stop_token_ids": ("a",)}),
    ("logprobs", {"logprobs": MAX_LOGPROBS + 1}), ("prompt_logprobs", {"prompt_logprobs": -1}),
    ("seed", {"seed": 2**70}), ("seed", {"seed": "7"}),
    ("response_format", {"response_format": {"type": "json_object"}}),
])
def test_sampling_params_name_the_openai_field(field, kwargs):
    with pytest.raises(ValueError, match=f"^{field}: "):
        SamplingParams(**kwargs)


def test_sampling_params_accept_the_edges():
    p = SamplingParams(n=128, best_of=128, logit_bias={"0": -100, 8191: 100}, presence_penalty=-2,
                       frequency_penalty=2, repetition_penalty=2.0, min_p=1.0, min_tokens=16,
                       max_tokens=16, stop_token_ids=[1, 2], seed=-(2**63), logprobs=20)
    assert p.logit_bias == {0: -100.0, 8191: 100.0} and p.stop_token_ids == (1, 2)
    assert p.num_sequences == 128 and not p.holds_outputs and p.has_penalties
    assert SamplingParams(n=2, best_of=5).holds_outputs


@pytest.mark.parametrize("args,message", [
    (("xml",), "type must be one of"), (("json_schema", "{"), "not valid JSON"),
    (("json_schema", None), "needs a JSON Schema"), (("json_schema", [1]), "needs a JSON Schema"),
])
def test_response_format_names_the_field(args, message):
    with pytest.raises(ValueError, match=f"^response_format: .*{message}"):
        ResponseFormat.create(*args)


def test_response_format_keeps_the_schema_order():
    assert ResponseFormat.create("text") is None
    fmt = ResponseFormat.create("json_schema", '{"properties": {"b": {}, "a": {}}}')
    assert fmt.schema == '{"properties":{"b":{},"a":{}}}'
    assert fmt == ResponseFormat.create("json_schema", {"properties": {"b": {}, "a": {}}})


def test_response_format_from_openai():
    assert ResponseFormat.from_openai(None) is None
    assert ResponseFormat.from_openai({"type": "text"}) is None
    assert ResponseFormat.from_openai({"type": "json_object"}) == ResponseFormat("json_object")
    fmt = ResponseFormat.from_openai({"type": "json_schema", "json_schema": {
        "name": "person", "strict": True, "schema": {"type": "object"}}})
    assert fmt == ResponseFormat("json_schema", '{"type":"object"}')
    for bad in ({"type": "json_schema"}, {"type": "json_schema", "json_schema": {"name": "x"}},
                {"type": 3}, "json_object", {"type": "yaml"}):
        with pytest.raises(ValueError, match="^response_format: "):
            ResponseFormat.from_openai(bad)


def test_draw_follows_the_distribution_and_its_generators():
    probs = torch.tensor([0.5, 0.3, 0.2, 0.0]).repeat(20000, 1)  # [N, 4]
    torch.manual_seed(0)
    toks = draw(probs, [None] * len(probs))
    freq = torch.bincount(toks, minlength=4).float() / len(toks)
    assert torch.allclose(freq, probs[0], atol=0.015) and freq[3] == 0
    gens = [torch.Generator().manual_seed(i % 5) for i in range(10)]
    a = draw(probs[:10], gens)
    b = draw(probs[:10], [torch.Generator().manual_seed(i % 5) for i in range(10)])
    assert torch.equal(a, b) and torch.equal(a[:5], a[5:])  # each row its own generator
