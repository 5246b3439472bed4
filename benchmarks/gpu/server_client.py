"""OpenAI-client checks of a running server with BASE: base-serve (--backend sglang) or SGLang's own.

    python3 benchmarks/gpu/server_client.py --base-url http://127.0.0.1:8000 --flavor base-serve \
        --model NAME --out OUT/server_checks.json

Checks, with the official `openai` client: /v1/models; completions and chat, plain and streamed;
a budget in the body (base-serve: "expert_budget"; SGLang: custom_params {"expert_budget": N}) and
in the X-Expert-Budget header; bad budgets (0, "abc", > E) in body and header -> HTTP 400.
Each check is {"name", "ok", "detail"}; the file gets one key per flavor. Exit status 1 if any
check failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

HEADER = "X-Expert-Budget"
PROMPT = " ".join(f"t{i}" for i in range(101, 133))  # 32 tokens of the synthetic tokenizer


def budget_body(flavor: str, budget) -> dict:
    """The request-body fields that carry a budget on this server."""
    if flavor == "base-serve":
        return {"expert_budget": budget}
    return {"custom_params": {"expert_budget": budget}}


def run_checks(client, flavor: str, model: str, num_experts: int, max_tokens: int = 8):
    import openai

    checks = []

    def check(name, fn):
        t0 = time.perf_counter()
        try:
            detail = fn()
            checks.append({"name": name, "ok": True, "detail": detail,
                           "s": round(time.perf_counter() - t0, 3)})
        except Exception as exc:  # noqa: BLE001 - every failure becomes a failed check
            checks.append({"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}"[:400],
                           "s": round(time.perf_counter() - t0, 3)})
        print(f"[client] {flavor}: {name}: {'ok' if checks[-1]['ok'] else 'FAILED'} "
              f"({checks[-1]['detail']})", flush=True)

    extra = {"ignore_eos": True}

    def models():
        ids = [m.id for m in client.models.list().data]
        _expect(model in ids, f"{model!r} not in /v1/models {ids}")
        return ids

    def completion(**kw):
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                      temperature=0, extra_body={**extra, **kw.pop("body", {})},
                                      **kw)
        _expect(r.choices and r.choices[0].text is not None, "no choice text")
        _expect(r.usage.completion_tokens == max_tokens,
                f"completion_tokens {r.usage.completion_tokens} != {max_tokens}")
        return r

    def completion_plain():
        r = completion()
        return {"text": r.choices[0].text[:60], "usage": r.usage.model_dump()}

    def chat_plain():
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=max_tokens,
            temperature=0, extra_body=extra)
        _expect(r.choices[0].message.content is not None, "no message content")
        _expect(r.usage.completion_tokens == max_tokens,
                f"completion_tokens {r.usage.completion_tokens} != {max_tokens}")
        return {"content": r.choices[0].message.content[:60]}

    def completion_stream():
        chunks, text = 0, ""
        for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                            temperature=0, stream=True, extra_body=extra):
            chunks += 1
            if ch.choices:
                text += ch.choices[0].text or ""
        _expect(chunks >= 2 and text, f"{chunks} chunks, text {text!r}")
        return {"chunks": chunks, "text": text[:60]}

    def chat_stream():
        chunks, text = 0, ""
        for ch in client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPT}],
                max_tokens=max_tokens, temperature=0, stream=True, extra_body=extra):
            chunks += 1
            if ch.choices and ch.choices[0].delta.content:
                text += ch.choices[0].delta.content
        _expect(chunks >= 2 and text, f"{chunks} chunks, text {text!r}")
        return {"chunks": chunks, "text": text[:60]}

    def body_budget(budget):
        def fn():
            raw = client.completions.with_raw_response.create(
                model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                extra_body={**extra, **budget_body(flavor, budget)})
            r = raw.parse()
            detail = {"header": raw.headers.get(HEADER)}
            if flavor == "base-serve":
                _expect(str(r.usage.expert_budget) == str(budget),
                        f"usage.expert_budget {r.usage.expert_budget} != {budget}")
                _expect(raw.headers.get(HEADER) == str(budget),
                        f"response {HEADER} {raw.headers.get(HEADER)} != {budget}")
                detail["usage"] = r.usage.model_dump()
            return detail
        return fn

    def header_budget(budget):
        def fn():
            raw = client.completions.with_raw_response.create(
                model=model, prompt=PROMPT, max_tokens=max_tokens, temperature=0,
                extra_body=extra, extra_headers={HEADER: str(budget)})
            r = raw.parse()
            if flavor == "base-serve":
                _expect(str(r.usage.expert_budget) == str(budget),
                        f"usage.expert_budget {r.usage.expert_budget} != {budget}")
            return {"header": raw.headers.get(HEADER), "tokens": r.usage.completion_tokens}
        return fn

    def bad(where, value, chat=False):
        def fn():
            kw = {"extra_body": {**extra, **budget_body(flavor, value)}} if where == "body" \
                else {"extra_body": extra, "extra_headers": {HEADER: str(value)}}
            try:
                if chat:
                    client.chat.completions.create(
                        model=model, messages=[{"role": "user", "content": PROMPT}],
                        max_tokens=max_tokens, **kw)
                else:
                    client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                              **kw)
            except openai.BadRequestError as exc:
                return {"status": exc.status_code, "message": str(exc)[:200]}
            raise AssertionError(f"budget {value!r} in the {where} was accepted (expected 400)")
        return fn

    check("models", models)
    check("completion", completion_plain)
    check("chat", chat_plain)
    check("completion stream", completion_stream)
    check("chat stream", chat_stream)
    for b in (16, 10):
        check(f"body budget {b}", body_budget(b))
        check(f"header budget {b}", header_budget(b))
    for value in (0, "abc", num_experts + 1):
        check(f"bad body budget {value!r} -> 400", bad("body", value))
    check("bad header budget 'abc' -> 400", bad("header", "abc"))
    check("bad chat body budget 0 -> 400", bad("body", 0, chat=True))
    return checks


def _expect(cond, msg):
    if not cond:
        raise AssertionError(msg)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True, help="http://HOST:PORT (without /v1)")
    p.add_argument("--flavor", choices=("base-serve", "sglang"), required=True)
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--num-experts", type=int, default=common.QWEN3_30B_A3B["num_experts"])
    p.add_argument("--out", required=True, help="JSON file (one key per flavor)")
    args = p.parse_args(argv)
    import openai

    client = openai.OpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key="none",
                           timeout=120.0, max_retries=0)
    checks = run_checks(client, args.flavor, args.model, args.num_experts)
    common.update_json(args.out, lambda obj: obj.update({args.flavor: {
        "checks": checks, "passed": sum(c["ok"] for c in checks), "total": len(checks),
        "openai_version": openai.__version__}}))
    failed = [c["name"] for c in checks if not c["ok"]]
    print(f"[client] {args.flavor}: {len(checks) - len(failed)}/{len(checks)} checks passed"
          + (f"; failed: {failed}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
