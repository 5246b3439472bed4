"""Budgets: X-Expert-Budget and custom_params -> sglang's request objects -> the static buffer."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch
from plugin_helpers import DEFAULT_BUDGET, E, forward_batch, model_runner, tiny_hf_config

from base_sglang.plugin import hooks


def _manager():
    """A real TokenizerManager object, not started (that needs scheduler processes): the hook
    reads only model_config.hf_text_config (for E), which is all that is set on it."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    manager = TokenizerManager.__new__(TokenizerManager)
    manager.model_config = SimpleNamespace(hf_text_config=tiny_hf_config())
    return manager


def _http_request(headers: dict):
    """A real Starlette request, as SGLang's HTTP routes hand it to generate_request."""
    from starlette.requests import Request

    raw = [(k.lower().encode(), str(v).encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/generate", "headers": raw})


def _generate(sampling_params, headers=None):
    """Call the real (patched) TokenizerManager.generate_request; return the request object.

    The BEFORE hook runs when the method is called; the original async generator is created but
    not iterated (it would need a running SGLang backend).
    """
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    obj = GenerateReqInput(text="hello", sampling_params=sampling_params)
    gen = TokenizerManager.generate_request(_manager(), obj,
                                            _http_request(headers) if headers is not None else None)
    assert inspect.isasyncgen(gen)  # the original was reached after the hook
    gen.aclose().close()  # never iterated: close without running it
    return obj


def _scheduled_req(rid, sampling_params):
    """What the scheduler builds from the tokenized request: SamplingParams (msgspec) -> Req."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    return Req(rid, "hello", [1, 2, 3], SamplingParams(**(sampling_params or {})))


def test_header_and_body_budgets_reach_the_buffer(base_state):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    objs = [
        _generate({"max_new_tokens": 4}, {"X-Expert-Budget": "3"}),  # header only
        _generate({"custom_params": {"expert_budget": 2}}, {"X-Expert-Budget": "6"}),  # body wins
        _generate(None, {"X-Expert-Budget": "dense"}),
        _generate({"temperature": 0.0}),  # no budget: BASE_DEFAULT_BUDGET
        _generate({"custom_params": {"expert_budget": "7"}}),  # numeric string in the body
    ]
    assert objs[0].sampling_params == {"max_new_tokens": 4, "custom_params": {"expert_budget": 3}}
    assert objs[1].sampling_params["custom_params"] == {"expert_budget": 2}
    assert objs[2].sampling_params == {"custom_params": {"expert_budget": E}}  # resolved once
    assert objs[3].sampling_params == {"temperature": 0.0}

    reqs = [_scheduled_req(f"r{i}", o.sampling_params) for i, o in enumerate(objs)]
    batch = ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.DECODE)
    fb = forward_batch(ForwardMode.DECODE, len(reqs))
    assert hooks.after_forward_batch_init(fb, ForwardBatch, batch, model_runner()) is None
    assert fb.base_budgets == [3, 2, E, DEFAULT_BUDGET, 7]

    seen = hooks.around_forward_raw(lambda r, b: base_state.budget.clone(), model_runner(), fb)
    assert seen.dtype == torch.int32
    assert seen.tolist() == [3, 2, E, DEFAULT_BUDGET, 7] + [-1] * (seen.numel() - 5)
    # a smaller next step overwrites the tail with padding (graph replays read the whole buffer)
    fb2 = forward_batch(ForwardMode.DECODE, 2)
    fb2.base_budgets = [1, 4]
    seen = hooks.around_forward_raw(lambda r, b: base_state.budget.clone(), model_runner(), fb2)
    assert seen.tolist() == [1, 4] + [-1] * (seen.numel() - 2)


def test_prefill_and_draft_batches_get_no_budgets(base_state):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    reqs = [_scheduled_req("a", {"custom_params": {"expert_budget": 2}})]
    batch = ScheduleBatch(reqs=reqs, forward_mode=ForwardMode.EXTEND)
    fb = forward_batch(ForwardMode.EXTEND, 1)
    hooks.after_forward_batch_init(fb, ForwardBatch, batch, model_runner())
    assert not hasattr(fb, "base_budgets")
    fb = forward_batch(ForwardMode.DECODE, 1)
    hooks.after_forward_batch_init(fb, ForwardBatch, batch, model_runner(is_draft_worker=True))
    assert not hasattr(fb, "base_budgets")


def test_batch_request_budgets(base_state):
    obj = _generate([{"max_new_tokens": 2}, {"custom_params": {"expert_budget": 1}}],
                    {"X-Expert-Budget": "4"})
    assert [p["custom_params"]["expert_budget"] for p in obj.sampling_params] == [4, 1]


@pytest.mark.parametrize("header", ["0", "-2", "abc", "2.5", "9", ""])
def test_bad_header_is_rejected_naming_it(base_state, header):
    with pytest.raises(ValueError, match="X-Expert-Budget"):
        _generate({"max_new_tokens": 4}, {"X-Expert-Budget": header})


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "many", 9, [2], None])
def test_bad_body_budget_is_rejected_naming_it(base_state, value):
    with pytest.raises(ValueError, match="expert_budget"):
        _generate({"custom_params": {"expert_budget": value}})


def test_custom_params_must_be_an_object(base_state):
    with pytest.raises(ValueError, match="custom_params"):
        _generate({"custom_params": [1, 2]}, {"X-Expert-Budget": "2"})


def test_sglang_generate_route_answers_400_naming_the_header(base_state):
    """SGLang's own /generate handler turns the hook's ValueError into an HTTP 400 body.

    0.5.23 splits the route into a contract check + `serve_generate_request`; 0.5.17's route
    function `generate_request` is that second part."""
    import asyncio
    import json

    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import GenerateReqInput

    previous = getattr(http_server, "_global_state", None)
    http_server.set_global_state(SimpleNamespace(tokenizer_manager=_manager()))
    try:
        obj = GenerateReqInput(text="hello", sampling_params={"max_new_tokens": 2})
        serve = getattr(http_server, "serve_generate_request", http_server.generate_request)
        resp = asyncio.run(serve(obj, _http_request({"X-Expert-Budget": "0"})))
    finally:
        http_server.set_global_state(previous)
    assert resp.status_code == 400
    assert "X-Expert-Budget: must be an integer" in json.loads(resp.body)["error"]["message"]


def test_decode_batch_without_budgets_gets_the_default_not_stale_rows(base_state):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    base_state.fill([1] * 8)  # a previous step's budgets
    fb = forward_batch(ForwardMode.DECODE, 3)  # never went through init_new
    seen = hooks.around_forward_raw(lambda r, b: base_state.budget.clone(), model_runner(), fb)
    assert seen.tolist()[:4] == [DEFAULT_BUDGET] * 3 + [-1]
