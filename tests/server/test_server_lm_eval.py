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


# ---- whole lm-eval tasks, built offline from JSONL files -------------------------------------------
QA = [{"question": "The quick brown", "answer": " fox"}, {"question": "def add(a, b):",
                                                          "answer": " return"},
      {"question": "Hello, world!", "answer": " How"}]
CHOICES = [{"ctx": "The quick brown", "choices": [" fox", " cat", " dog"], "gold": 0},
           {"ctx": "def add(a, b):", "choices": ["\n    return", " pass"], "gold": 0},
           {"ctx": "Numbers: 1 2", "choices": [" 3", " 9", " x"], "gold": 0}]


def _task(tmp_path, name, rows, body):
    """A task YAML over a local JSONL file (the `json` dataset builder: no hub access)."""
    import json

    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {data}\ntest_split: test\n{body}")
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(tmp_path))


def test_local_chat_completions_task(server, tmp_path, monkeypatch):
    """simple_evaluate with `local-chat-completions` on a generate_until task: every prediction is
    what the server's chat route answers for the same messages (with the budget header)."""
    import lm_eval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tm = _task(tmp_path, "base_tiny_chat", QA,
               'output_type: generate_until\ndoc_to_text: "{{question}}"\n'
               'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n\\n"]\n'
               "  max_gen_toks: 8\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    lm = lm_eval_api.LocalChatCompletion(
        model=MODEL, base_url=f"{server.url}/v1/chat/completions", max_retries=1,
        header={"X-Expert-Budget": "2"})
    out = lm_eval.simple_evaluate(model=lm, tasks=["base_tiny_chat"], task_manager=tm,
                                  apply_chat_template=True, log_samples=True)
    samples = out["samples"]["base_tiny_chat"]
    assert len(samples) == len(QA) and "exact_match,none" in out["results"]["base_tiny_chat"]
    for s in samples:
        direct = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                            headers={"X-Expert-Budget": "2"}, json={
                                "model": MODEL, "max_tokens": 8, "temperature": 0,
                                "stop": ["\n\n"], "seed": 1234,
                                "messages": [{"role": "user", "content": s["doc"]["question"]}]})
        assert s["resps"][0][0] == direct.json()["choices"][0]["message"]["content"]


def test_local_completions_multiple_choice_task(server, tmp_path, monkeypatch):
    """simple_evaluate with `local-completions` on a multiple_choice task: its accuracy is the
    reference model's (argmax of the continuations' summed logprobs)."""
    import lm_eval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    tm = _task(tmp_path, "base_tiny_mc", CHOICES,
               'output_type: multiple_choice\ndoc_to_text: "{{ctx}}"\ndoc_to_choice: "{{choices}}"\n'
               "doc_to_target: gold\ntarget_delimiter: \"\"\nmetric_list:\n  - metric: acc\n")
    lm = lm_eval_api.LocalCompletionsAPI(
        model=MODEL, base_url=f"{server.url}/v1/completions", tokenizer_backend="huggingface",
        tokenizer=server.model_dir, batch_size=4, max_retries=1)
    out = lm_eval.simple_evaluate(model=lm, tasks=["base_tiny_mc"], task_manager=tm)
    model = AutoModelForCausalLM.from_pretrained(server.model_dir).eval()
    tok = server.engine.tokenizer
    hits = []
    for row in CHOICES:
        scores = [reference_loglikelihood(model, tok, row["ctx"], c)[0] for c in row["choices"]]
        hits.append(max(range(len(scores)), key=scores.__getitem__) == row["gold"])
    assert out["results"]["base_tiny_mc"]["acc,none"] == pytest.approx(sum(hits) / len(hits))
