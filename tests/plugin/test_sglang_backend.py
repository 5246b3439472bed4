"""base-serve --backend sglang: argument mapping, startup checks, budget plumbing, output mapping.

Starting SGLang's Engine needs a GPU node (and the sgl-kernel wheel), so the route test at the end
drives our real app and SGLangBackend against `FakeEngine`: a deliberately minimal stand-in for
sglang.Engine that records what async_generate receives and streams outputs in the exact shape
SGLang's TokenizerManager yields with incremental_streaming_output. Everything else here runs the
real code: SGLang's own argument parser, ServerArgs, the plugin hooks, SamplingParams and Req.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from plugin_helpers import E
from test_budgets import _generate, _scheduled_req

from base_sglang.core import DEFAULT_POLICY, PredictorMismatch
from base_sglang.engine import SamplingParams
from base_sglang.plugin.budget import token_budgets
from base_sglang.plugin.checks import UnsupportedConfig
from base_sglang.server.backends import sglang as backend
from base_sglang.server.settings import Settings

ENV_KEYS = ("BASE_PREDICTOR", "BASE_POLICY", "BASE_DEFAULT_BUDGET", "SGLANG_PLUGINS")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from base_sglang.testing.models import create_tiny_moe

    return create_tiny_moe(tmp_path_factory.mktemp("tiny-sglang"), num_experts=E)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Settings reads BASE_* (the session set some for the plugin) and create_backend writes them:
    start each test without them; monkeypatch restores the session's values afterwards."""
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)


def _settings(model, *backend_args, **fields):
    # a CPU-only machine: sglang 0.5.17's ServerArgs raises "No accelerator" unless told the device
    fields.setdefault("device", "cpu")
    return Settings(model=str(model), backend="sglang", backend_args=list(backend_args), **fields)


def test_server_args_from_base_serve_flags(plugin_env, tiny_model):
    args = backend.build_server_args(_settings(tiny_model, "--tp-size", "2",
                                               "--mem-fraction-static=0.7",
                                               max_running_requests=48, served_model_name="m"))
    assert (args.model_path, args.tp_size, args.mem_fraction_static) == (str(tiny_model), 2, 0.7)
    assert args.max_running_requests == 48 and args.served_model_name == "m"
    assert args.moe_runner_backend == "triton"  # BASE's runner unless the operator chose one
    assert args.incremental_streaming_output is True  # request_output() reads deltas
    chosen = backend.build_server_args(_settings(tiny_model, "--moe-runner-backend", "auto"))
    assert chosen.moe_runner_backend == "auto"


@pytest.mark.parametrize("args, name", [(["--tp-size", "two"], "--tp-size"),
                                        (["--no-such-flag"], "--no-such-flag")])
def test_bad_sglang_arguments_are_named(plugin_env, tiny_model, args, name):
    with pytest.raises(ValueError, match=name):
        backend.build_server_args(_settings(tiny_model, *args))


def test_preflight_finds_predictor_and_experts(tiny_model):
    predictor, num_experts = backend.preflight(_settings(tiny_model))
    assert predictor == str(tiny_model / "predictor.safetensors") and num_experts == E


def test_preflight_refuses_tied_embeddings_and_the_untied_copy_passes(tiny_model, tmp_path):
    """SGLang's Qwen3-MoE ignores tie_word_embeddings (seen on the H200 with the shipped proxy)."""
    import json
    import shutil

    from base_sglang.hf.untie import untie_embeddings

    tied = tmp_path / "tied"
    shutil.copytree(tiny_model, tied)
    cfg = json.loads((tied / "config.json").read_text())
    (tied / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    with pytest.raises(ValueError, match="base_sglang.hf.untie"):
        backend.preflight(_settings(tied))
    untied = untie_embeddings(tied, tmp_path / "untied")
    assert backend.preflight(_settings(untied))[1] == E


def test_preflight_errors_name_the_option(tiny_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="model: "):
        backend.preflight(_settings(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="predictor: "):
        backend.preflight(_settings(tiny_model, predictor=str(tmp_path / "p.safetensors")))
    with pytest.raises(ValueError, match="default_budget"):
        backend.preflight(_settings(tiny_model, default_budget="9"))  # the model has 8 experts
    from plugin_helpers import make_predictor

    make_predictor(num_experts=4).save(tmp_path / "other.safetensors")
    with pytest.raises(PredictorMismatch, match="'hidden_size'|'num_experts'"):
        backend.preflight(_settings(tiny_model, predictor=str(tmp_path / "other.safetensors")))


def test_dense_policy_needs_no_predictor(tmp_path):
    from base_sglang.testing.models import create_tiny_moe

    model = create_tiny_moe(tmp_path / "m", num_experts=E, with_predictor=False)
    assert backend.preflight(_settings(model, policy="dense")) == (None, E)


def test_unsupported_sglang_settings_are_refused_before_the_engine_starts(
        plugin_env, tiny_model, monkeypatch):
    import os

    monkeypatch.setenv("SGLANG_PLUGINS", "other")
    with pytest.raises(UnsupportedConfig, match="--ep-size 2"):
        backend.create_backend(_settings(tiny_model, "--ep-size", "2", "--tp-size", "2",
                                         default_budget="4"))
    # the plugin configuration SGLang's processes would inherit
    assert os.environ["BASE_PREDICTOR"] == str(tiny_model / "predictor.safetensors")
    assert os.environ["BASE_DEFAULT_BUDGET"] == "4" and os.environ["BASE_POLICY"] == DEFAULT_POLICY
    assert os.environ["SGLANG_PLUGINS"] == "other,base"


@pytest.mark.parametrize("budget, want", [(3, 3), (E, E), (None, 5)])
def test_budget_reaches_sglang_requests(base_state, budget, want):
    """sampling params -> the plugin's generate_request hook -> SGLang SamplingParams -> Req."""
    params = SamplingParams(temperature=0.0, max_tokens=7, stop=("\n",), top_k=20, seed=3)
    sp = backend.sglang_sampling_params(params, budget)
    assert sp["max_new_tokens"] == 7 and sp["stop"] == ["\n"] and sp["top_k"] == 20
    assert sp["sampling_seed"] == 3 and sp["temperature"] == 0.0
    obj = _generate(sp)  # the same call Engine.async_generate makes (no HTTP request)
    req = _scheduled_req("r", obj.sampling_params)
    assert req.sampling_params.max_new_tokens == 7
    assert token_budgets([req], default=5, num_experts=E) == [want]  # 5: the default budget


def _chunk(text, ids, completion_tokens, finish=None, logprobs=None):
    meta = {"id": "r", "prompt_tokens": 3, "completion_tokens": completion_tokens,
            "finish_reason": finish}
    if logprobs is not None:
        meta["output_token_logprobs"] = [(lp, tid, None) for lp, tid in logprobs]
        meta["output_top_logprobs"] = [[(lp, tid, None), (lp - 1.0, tid + 1, None)]
                                       for lp, tid in logprobs]
        meta["input_token_logprobs"] = [(None, 1, None), (-0.5, 2, None), (-0.25, 3, None)]
        meta["input_top_logprobs"] = [None, [(-0.5, 2, None)], [(-0.25, 3, None)]]
    return {"text": text, "output_ids": ids, "meta_info": meta}


def test_request_output_maps_sglang_stream_chunks():
    params = SamplingParams(max_tokens=4, logprobs=1, prompt_logprobs=1)
    first = backend.request_output(_chunk("He", [5], 1, logprobs=[(-0.1, 5)]), "r", 3, params, True)
    assert (first.text, first.token_ids, first.finished, first.finish_reason) == ("He", [5], False,
                                                                                 None)
    assert first.logprobs[0].token_id == 5 and first.logprobs[0].top == {5: -0.1, 6: -1.1}
    assert first.prompt_logprobs[0] is None and first.prompt_logprobs[2].logprob == -0.25
    last = backend.request_output(_chunk("llo", [6, 7], 3, {"type": "length", "length": 3},
                                         logprobs=[(-0.2, 6), (-0.3, 7)]), "r", 3, params, False)
    assert (last.finished, last.finish_reason, last.num_output_tokens) == (True, "length", 3)
    assert last.prompt_logprobs is None and [lp.token_id for lp in last.logprobs] == [6, 7]
    stop = backend.request_output(_chunk("", [], 1, {"type": "stop", "matched": 2}), "r", E,
                                  SamplingParams(), False)
    assert stop.finish_reason == "stop" and stop.budget == E and stop.logprobs is None
    abort = backend.request_output(_chunk("", [], 1, {"type": "abort", "message": "x"}), "r", 2,
                                   SamplingParams(), False)
    assert abort.finish_reason == "abort"


class FakeEngine:
    """Minimal stand-in for sglang.Engine (see the module docstring): async_generate + shutdown."""

    def __init__(self, tokenizer):
        from types import SimpleNamespace

        self.calls, self.aborted, self.stopped = [], [], False
        self.tokenizer_manager = SimpleNamespace(context_len=256, tokenizer=tokenizer,
                                                 rid_to_state={}, abort_request=self._abort)
        self.server_args = SimpleNamespace(model_path="tiny", tp_size=1, max_running_requests=8)

    def _abort(self, rid):
        self.aborted.append(rid)

    async def async_generate(self, **kwargs):
        self.calls.append(kwargs)

        async def stream():
            yield _chunk("Hello", [11], 1)
            yield _chunk(" world", [12], 2, {"type": "length", "length": 2})

        return stream()

    def shutdown(self):
        self.stopped = True


def test_openai_routes_over_the_sglang_backend(plugin_env, tiny_model):
    from fastapi.testclient import TestClient
    from transformers import AutoTokenizer

    from base_sglang.server.app import create_app

    engine = FakeEngine(AutoTokenizer.from_pretrained(tiny_model))
    be = backend.SGLangBackend(engine, "tiny", num_experts=E, policy="base")
    app = create_app(be, Settings(model=str(tiny_model), backend="sglang", default_budget="6"))
    with TestClient(app) as client:
        r = client.post("/v1/completions", headers={"X-Expert-Budget": "3"},
                        json={"model": "tiny", "prompt": "hi there", "max_tokens": 2})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["text"] == "Hello world"
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 2 and body["usage"]["expert_budget"] == 3
        call = engine.calls[-1]
        assert call["sampling_params"]["custom_params"] == {"expert_budget": 3}
        assert call["sampling_params"]["max_new_tokens"] == 2 and call["stream"] is True
        assert call["input_ids"] == AutoTokenizer.from_pretrained(tiny_model).encode("hi there")

        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "expert_budget": "dense", "stream": True})
        events = [json.loads(x[6:]) for x in r.text.split("\n\n") if x.startswith("data: {")]
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events
                       if e.get("choices")) == "Hello world"
        assert "custom_params" in engine.calls[-1]["sampling_params"]
        assert engine.calls[-1]["sampling_params"]["custom_params"]["expert_budget"] == E  # dense

        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
        assert engine.calls[-1]["sampling_params"]["custom_params"] == {"expert_budget": 6}

        r = client.post("/v1/completions", headers={"X-Expert-Budget": "0"},
                        json={"model": "tiny", "prompt": "hi"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Expert-Budget"
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi",
                                                 "max_tokens": 400})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        assert "base_requests_total" in client.get("/metrics").text
    assert engine.stopped


# ---- the OpenAI surface over the sglang backend ---------------------------------------------------
def test_sampling_controls_map_onto_sglang_fields(base_state):
    """Every control becomes SGLang's own field, and SGLang's SamplingParams (normalize + verify
    against the vocabulary) accepts the values; the budget still reaches the Req."""
    from sglang.srt.sampling.sampling_params import SamplingParams as SGLangParams

    from base_sglang.protocol import ResponseFormat

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, max_tokens=9, min_tokens=2, seed=2**64 - 1,
        stop=("x",), stop_token_ids=(7, 9), logit_bias={3: -100.0, 5: 2.5},
        presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.3,
        response_format=ResponseFormat.create("json_schema", schema))
    sp = backend.sglang_sampling_params(params, 4, index=1)
    assert (sp["min_p"], sp["min_new_tokens"], sp["stop_token_ids"]) == (0.1, 2, [7, 9])
    assert (sp["presence_penalty"], sp["frequency_penalty"], sp["repetition_penalty"]) == \
        (0.5, -1.0, 1.3)
    assert sp["logit_bias"] == {"3": -100.0, "5": 2.5}  # SGLang keys token ids as strings
    assert json.loads(sp["json_schema"]) == schema
    assert sp["sampling_seed"] == backend.choice_seed(2**64 - 1, 1)
    sgl = SGLangParams(**sp)
    sgl.verify(vocab_size=64)  # SGLang's own range checks (seed in int64, logit_bias keys, ...)
    req = _scheduled_req("r", _generate(sp).sampling_params)
    assert token_budgets([req], default=5, num_experts=E) == [4]
    obj = backend.sglang_sampling_params(SamplingParams(
        response_format=ResponseFormat.create("json_object")), None)
    assert obj["json_schema"] == '{"type": "object"}' and "custom_params" not in obj


def test_choice_seeds_are_distinct_signed_int64():
    seeds = [backend.choice_seed(2**64 - 1, i) for i in range(4)]
    assert len(set(seeds)) == 4 and all(-(2**63) <= s < 2**63 for s in seeds)
    assert backend.choice_seed(7, 0) == 7 and backend.choice_seed(None, 3) is None


class ChoicesEngine(FakeEngine):
    """FakeEngine answering each choice's rid with its own tokens and logprobs, the warm-up
    prefill (stream=False) with a dict, (refuse=True) a grammar refusal as SGLang sends it, and
    (hang=True) nothing after the first token."""

    def __init__(self, tokenizer, refuse=False, hang=False):
        super().__init__(tokenizer)
        self.refuse, self.hang = refuse, hang

    async def async_generate(self, **kwargs):
        self.calls.append(kwargs)
        if not kwargs.get("stream"):
            return {"text": "", "output_ids": [], "meta_info": {"finish_reason": {
                "type": "length", "length": 0}, "prompt_tokens": 3, "completion_tokens": 0}}
        i = int(kwargs["rid"].rsplit("-", 1)[1]) if "-" in kwargs["rid"] else 0
        lp = -1.0 - i if i != 2 else -0.1  # choice 2 is the most likely

        async def stream():
            if self.refuse:
                yield {"text": "", "output_ids": [], "meta_info": {"id": "x", "finish_reason": {
                    "type": "abort", "status_code": 400, "message": "Invalid grammar"},
                    "prompt_tokens": 3, "completion_tokens": 0}}
                return
            yield _chunk(f"c{i}", [10 + i], 1, logprobs=[(lp, 10 + i)])
            if self.hang:  # a long generation: the client leaves before it ends
                await asyncio.sleep(3600)
            yield _chunk(" end", [20 + i], 2, {"type": "length", "length": 2},
                         logprobs=[(lp, 20 + i)])

        return stream()


def _app(engine, tiny_model):
    from fastapi.testclient import TestClient

    from base_sglang.server.app import create_app

    be = backend.SGLangBackend(engine, "tiny", num_experts=E, policy="base")
    return be, TestClient(create_app(be, Settings(model=str(tiny_model), backend="sglang")))


def test_n_and_best_of_over_sglang(plugin_env, tiny_model):
    from transformers import AutoTokenizer

    engine = ChoicesEngine(AutoTokenizer.from_pretrained(tiny_model))
    be, client = _app(engine, tiny_model)
    with client:
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 3,
                                                 "max_tokens": 2, "seed": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [c["text"] for c in body["choices"]] == ["c0 end", "c1 end", "c2 end"]
        assert body["usage"]["completion_tokens"] == 6 and body["usage"]["prompt_tokens"] == 3
        warm, *calls = engine.calls[-4:]
        assert warm["sampling_params"]["max_new_tokens"] == 0 and not warm.get("stream")
        assert [c["rid"].rsplit("-", 1)[1] for c in calls] == ["0", "1", "2"]
        assert len({c["sampling_params"]["sampling_seed"] for c in calls}) == 3
        best = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "n": 1,
                                                    "best_of": 3, "max_tokens": 2}).json()
        assert [c["text"] for c in best["choices"]] == ["c2 end"]  # the highest logprob sum
        assert all(c["return_logprob"] for c in engine.calls[-3:])  # ranking needs them
        chat = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "stream": True, "max_tokens": 2})
        events = [json.loads(x[6:]) for x in chat.text.split("\n\n") if x.startswith("data: {")]
        text = {0: "", 1: ""}
        for e in events:
            text[e["choices"][0]["index"]] += e["choices"][0]["delta"].get("content") or ""
        assert text == {0: "c0 end", 1: "c1 end"}
        native = client.post("/generate", json={"text": "hi", "sampling_params": {
            "max_new_tokens": 2, "n": 2}}).json()  # SGLang's own route shape, same path
        assert [o["text"] for o in native] == ["c0 end", "c1 end"]
    assert not be._children  # every request's choices were released


def test_leaving_a_multi_choice_stream_aborts_every_choice(plugin_env, tiny_model):
    from transformers import AutoTokenizer

    engine = ChoicesEngine(AutoTokenizer.from_pretrained(tiny_model), hang=True)
    be = backend.SGLangBackend(engine, "tiny", num_experts=E, policy="base")

    async def leave_early():
        stream = be.generate([1, 2, 3], SamplingParams(max_tokens=2, n=2), 3, "req")
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(leave_early())
    assert {"req-0", "req-1"} <= set(engine.aborted) and not be._children


def test_a_grammar_sglang_refuses_is_a_400(plugin_env, tiny_model):
    from transformers import AutoTokenizer

    _, client = _app(ChoicesEngine(AutoTokenizer.from_pretrained(tiny_model), refuse=True),
                     tiny_model)
    with client:
        r = client.post("/v1/chat/completions", json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert "Invalid grammar" in r.json()["error"]["message"]


def test_error_targeted_budgets_are_refused_over_sglang(plugin_env, tiny_model):
    """The plugin reads expert counts only: a bounded request is a 400 naming the field (and the
    native backend), before anything reaches SGLang; expert counts still go through."""
    from transformers import AutoTokenizer

    engine = FakeEngine(AutoTokenizer.from_pretrained(tiny_model))
    be, client = _app(engine, tiny_model)
    with client:
        for path, body in (("/v1/completions", {"prompt": "hi"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
            for stream in (False, True):
                r = client.post(path, json={"model": "tiny", "max_tokens": 2, "stream": stream,
                                            "expert_budget": {"max_error": 0.05}, **body})
                err = r.json()["error"]
                assert r.status_code == 400 and err["param"] == "expert_budget.max_error"
                assert "native backend" in err["message"]
        assert engine.calls == []
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2,
                                                 "expert_budget": 3})
        assert r.status_code == 200 and engine.calls[-1]["sampling_params"]["custom_params"] \
            == {"expert_budget": 3}
    with pytest.raises(ValueError, match="^expert_budget.max_error: .*not supported by the sglang"):
        be.generate([1, 2], SamplingParams(), 3, "r", max_error=0.1)
