"""lm-evaluation-harness's `local-completions` model scores and generates through the live server."""

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

lm_eval_api = pytest.importorskip("lm_eval.models.openai_completions")
from lm_eval.api.instance import Instance  # noqa: E402

MODEL = "tiny"  # served_model_name in conftest.py
PAIRS = [("The quick brown", " fox jumps"), ("def add(a, b):", "\n    return a + b"),
         ("Hello, world!", " How are you")]


def reference_loglikelihood(model, tok, context, continuation):
    ctx, cont = tok.encode(context), tok.encode(continuation)
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)  # [L, V]
    rows = logp[len(ctx) - 1:-1]  # predictions of the continuation tokens
    picked = rows.gather(1, torch.tensor(cont)[:, None])[:, 0]
    return picked.sum().item(), bool((rows.argmax(-1) == torch.tensor(cont)).all())


@pytest.mark.parametrize("budget", [None, "2"])
def test_local_completions_loglikelihood(server, budget):
    header = {"X-Expert-Budget": budget} if budget else None
    lm = lm_eval_api.LocalCompletionsAPI(
        model=MODEL, base_url=f"{server.url}/v1/completions", tokenizer_backend="huggingface",
        tokenizer=server.model_dir, batch_size=2, max_retries=1, header=header)
    requests = [Instance("loglikelihood", {}, (c, x), i) for i, (c, x) in enumerate(PAIRS)]
    got = lm.loglikelihood(requests)
    model = AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    tok = server.engine.tokenizer
    for (context, continuation), (logprob, greedy) in zip(PAIRS, got):
        ref, ref_greedy = reference_loglikelihood(model, tok, context, continuation)
        assert logprob == pytest.approx(ref, abs=1e-3)  # prefill is dense whatever the budget
        assert greedy == ref_greedy


def test_local_completions_generate_until(server):
    lm = lm_eval_api.LocalCompletionsAPI(
        model=MODEL, base_url=f"{server.url}/v1/completions", tokenizer_backend="huggingface",
        tokenizer=server.model_dir, max_retries=1, max_gen_toks=8, tokenized_requests=False)
    req = Instance("generate_until", {}, ("The quick brown", {"until": ["\n\n"], "max_gen_toks": 8}), 0)
    [text] = lm.generate_until([req])
    body = {"model": MODEL, "prompt": "The quick brown", "max_tokens": 8, "temperature": 0,
            "stop": ["\n\n"]}
    direct = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
    assert text == direct["choices"][0]["text"] and direct["usage"]["completion_tokens"] <= 8
