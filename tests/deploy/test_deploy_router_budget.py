"""The per-request expert budget must reach the replicas through SGLang's model gateway.

Real processes on loopback: the pinned gateway (`smg`, the router of deploy/compose.yml) runs as
a subprocess in front of two real uvicorn replicas that record every request they receive. The
replicas stand in for base-serve: what is under test is what the router forwards, so they answer
the routes the router probes (/health, /v1/models) and echo the generate routes.

Findings these tests pin down (smg 1.13.0):
- every JSON body field, `expert_budget` included, is forwarded on /v1/chat/completions and
  /v1/completions (the older `sglang-router` 0.3.2 re-serialises chat requests and drops it);
- request headers are forwarded from a fixed allow-list (smg model_gateway/src/routers/common/
  header_utils.rs, should_forward_request_header: authorization, x-request-id, x-correlation-id,
  traceparent, tracestate, x-smg-routing-key, x-request-id-*), so X-Expert-Budget is dropped:
  through the router the budget travels in the body. If a gateway upgrade starts forwarding the
  header, test_budget_header_is_not_forwarded fails and the deploy docs should say so.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

smg = pytest.importorskip("smg", reason="the SGLang model gateway is not installed: pip install smg==1.13.0")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

API_KEY = "test-key-0123"
MODEL = "proxy-moe"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_replica(name: str, seen: list):
    app = fastapi.FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "base"}]}

    async def generate(request: fastapi.Request, kind: str):
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            raise fastapi.HTTPException(401, "bad API key")
        body = await request.json()
        seen.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        budget = body.get("expert_budget")
        text = f"{name}:{budget}"
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        else:
            choice = {"index": 0, "text": text, "finish_reason": "stop"}
        return {"id": f"{kind}-1", "object": "chat.completion" if kind == "chat" else "text_completion",
                "created": 0, "model": MODEL, "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.post("/v1/chat/completions")
    async def chat(request: fastapi.Request):
        return await generate(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: fastapi.Request):
        return await generate(request, "text")

    return app


class Replica:
    def __init__(self, name: str):
        self.name, self.seen, self.port = name, [], free_port()
        config = uvicorn.Config(make_replica(name, self.seen), host="127.0.0.1", port=self.port,
                                log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, f"replica {self.name} did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two replicas behind the gateway, configured as deploy/compose.yml configures it."""
    log = tmp_path_factory.mktemp("router") / "router.log"
    with Replica("a") as a, Replica("b") as b:
        port, metrics_port = free_port(), free_port()
        cmd = [sys.executable, "-m", "smg", "launch",
               "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
               "--api-key", API_KEY, "--policy", "round_robin", "--health-check-endpoint", "/health",
               "--shutdown-grace-period-secs", "1",
               "--worker-urls", f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}"]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "NO_COLOR": "1"})
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, f"router exited: {log.read_text()[-2000:]}"
                assert time.monotonic() < deadline, f"router not ready: {log.read_text()[-2000:]}"
                try:
                    ready = httpx.get(f"{url}/readiness", timeout=2)
                    if ready.status_code == 200 and ready.json().get("healthy_workers") == 2:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            yield url, a, b
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}", **(headers or {})}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=30)


def last_seen(a: Replica, b: Replica) -> dict:
    both = a.seen + b.seen
    assert both, "no request reached a replica"
    return max(both, key=lambda r: r["body"].get("_seq", -1))


def chat_body(seq: int, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "_seq": seq, **extra}


def test_body_budget_reaches_every_replica_on_chat_and_completions(cluster):
    url, a, b = cluster
    a.seen.clear()
    b.seen.clear()
    sent = []
    for seq, budget in enumerate([3, 17, 64, 128]):
        path = "/v1/chat/completions" if seq % 2 == 0 else "/v1/completions"
        body = (chat_body(seq, expert_budget=budget) if seq % 2 == 0 else
                {"model": MODEL, "prompt": "hi", "max_tokens": 4, "_seq": seq, "expert_budget": budget})
        resp = post(url, path, body)
        assert resp.status_code == 200, resp.text
        sent.append((seq, path, budget))
    received = sorted((r["body"]["_seq"], r["path"], r["body"]["expert_budget"]) for r in a.seen + b.seen)
    assert received == sent
    # the value arrives as the JSON integer that was sent, not re-typed
    assert all(type(r["body"]["expert_budget"]) is int for r in a.seen + b.seen)
    # round robin: both replicas served budgeted requests
    assert len(a.seen) == 2 and len(b.seen) == 2


def test_openai_client_extra_body_budget_arrives(cluster):
    url, a, b = cluster
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    for budget in (5, 9):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            extra_body={"expert_budget": budget, "_seq": 1000 + budget})
        replica, got = reply.choices[0].message.content.split(":")
        assert int(got) == budget
        assert replica in ("a", "b")
        assert last_seen(a, b)["body"]["expert_budget"] == budget


def test_budget_header_is_not_forwarded(cluster):
    url, a, b = cluster
    resp = post(url, "/v1/chat/completions", chat_body(2000, expert_budget=11),
                headers={"X-Expert-Budget": "7", "X-Request-Id": "req-budget-2000"})
    assert resp.status_code == 200, resp.text
    seen = last_seen(a, b)
    assert seen["body"]["_seq"] == 2000
    assert "x-expert-budget" not in seen["headers"]
    assert seen["body"]["expert_budget"] == 11
    # allow-listed headers do pass: the request id, and the caller's Authorization
    assert seen["headers"].get("x-request-id") == "req-budget-2000"
    assert seen["headers"].get("authorization") == f"Bearer {API_KEY}"


def test_router_rejects_requests_without_the_api_key(cluster):
    url, a, b = cluster
    before = len(a.seen) + len(b.seen)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(f"{url}/v1/chat/completions", json=chat_body(3000, expert_budget=4),
                          headers=headers, timeout=30)
        assert resp.status_code == 401, resp.text
        assert "error" in json.loads(resp.text)
    assert len(a.seen) + len(b.seen) == before
