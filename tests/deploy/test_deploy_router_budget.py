"""The per-request expert budget must reach the replicas through SGLang's model gateway.

Real processes on loopback only: the pinned gateway (`smg`, the router image of the Dockerfile and
deploy/compose.yml) runs as a subprocess, configured as compose configures it (API key, health
endpoint), in front of two replicas served by uvicorn:
- "echo" replicas record the raw request they receive (headers and JSON body), to see exactly
  what the router forwards;
- real base-serve replicas (the server's FastAPI app and native engine on a tiny random Qwen3-MoE
  checkpoint), whose responses report the budget each request was served with
  (`usage.expert_budget`), to see that the forwarded budget is the one applied.

What they pin down for smg 1.13.0:
- every JSON body field, `expert_budget` included, is forwarded on /v1/chat/completions and
  /v1/completions (the older `sglang-router` 0.3.2 re-serialises chat requests and drops it);
- request headers are forwarded from a fixed allow-list (smg model_gateway/src/routers/common/
  header_utils.rs, should_forward_request_header: authorization, x-request-id, x-correlation-id,
  traceparent, tracestate, x-smg-routing-key, x-request-id-*), so X-Expert-Budget does not reach
  the replicas: through the router the budget travels in the body. Should a gateway upgrade start
  forwarding the header, the header tests here fail and the deploy docs must change with them.
"""

import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

import httpx
import pytest

pytest.importorskip("smg", reason="SGLang model gateway not installed: pip install smg==1.13.0")
fastapi = pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

API_KEY = "test-key-0123"
ECHO_MODEL = "proxy-moe"
DEFAULT_BUDGET = 4  # of the base-serve replicas; the tiny model has 8 experts per layer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """An ASGI app served by uvicorn on a loopback port, in a thread of the test process."""

    def __init__(self, app, name: str):
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive(), f"replica {self.name} failed to start"
            assert time.monotonic() < deadline, f"replica {self.name} did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=20)


def make_echo_app(name: str, seen: list):
    app = fastapi.FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": ECHO_MODEL, "object": "model", "owned_by": "base"}]}

    async def generate(request: fastapi.Request, chat: bool):
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            raise fastapi.HTTPException(401, "bad API key")
        body = await request.json()
        seen.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        text = f"{name}:{body.get('expert_budget')}"
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                  if chat else {"index": 0, "text": text, "finish_reason": "stop"})
        return {"id": "x-1", "object": "chat.completion" if chat else "text_completion", "created": 0,
                "model": ECHO_MODEL, "choices": [choice],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    @app.post("/v1/chat/completions")
    async def chat(request: fastapi.Request):
        return await generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: fastapi.Request):
        return await generate(request, chat=False)

    return app


class Router:
    """`smg launch` as deploy/compose.yml runs it, on loopback, in front of the given replicas."""

    def __init__(self, worker_urls: list[str], log_path):
        self.port, self.log_path = free_port(), log_path
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "smg", "launch",
                    "--host", "127.0.0.1", "--port", str(self.port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                    "--api-key", API_KEY, "--policy", "round_robin",
                    "--health-check-endpoint", "/health", "--shutdown-grace-period-secs", "1",
                    "--worker-urls", *worker_urls]
        self.num_workers = len(worker_urls)

    def log(self) -> str:
        return self.log_path.read_text()[-3000:]

    def __enter__(self):
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "NO_COLOR": "1"})
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"router exited:\n{self.log()}"
            assert time.monotonic() < deadline, f"router not ready:\n{self.log()}"
            try:
                ready = httpx.get(f"{self.url}/readiness", timeout=2)
                if ready.status_code == 200 and ready.json().get("healthy_workers") == self.num_workers:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}", **(headers or {})}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=60)


# ---- what the router forwards (echo replicas) --------------------------------------------------

@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    seen_a, seen_b = [], []
    log = tmp_path_factory.mktemp("router-echo") / "router.log"
    with Replica(make_echo_app("a", seen_a), "a") as a, Replica(make_echo_app("b", seen_b), "b") as b:
        with Router([a.url, b.url], log) as router:
            yield router.url, seen_a, seen_b


def chat_body(seq: int, **extra) -> dict:
    return {"model": ECHO_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "_seq": seq, **extra}


def find(seen_a: list, seen_b: list, seq: int) -> dict:
    hits = [r for r in seen_a + seen_b if r["body"].get("_seq") == seq]
    assert len(hits) == 1, f"request {seq} reached {len(hits)} replicas"
    return hits[0]


def test_body_budget_reaches_every_replica_on_chat_and_completions(echo):
    url, seen_a, seen_b = echo
    seen_a.clear()
    seen_b.clear()
    sent = []
    for seq, budget in enumerate([3, 17, 64, 128]):
        if seq % 2 == 0:
            path, body = "/v1/chat/completions", chat_body(seq, expert_budget=budget)
        else:
            path = "/v1/completions"
            body = {"model": ECHO_MODEL, "prompt": "hi", "max_tokens": 4, "_seq": seq,
                    "expert_budget": budget}
        resp = post(url, path, body)
        assert resp.status_code == 200, resp.text
        sent.append((seq, path, budget))
    received = sorted((r["body"]["_seq"], r["path"], r["body"]["expert_budget"])
                      for r in seen_a + seen_b)
    assert received == sent
    assert all(type(r["body"]["expert_budget"]) is int for r in seen_a + seen_b)
    assert len(seen_a) == 2 and len(seen_b) == 2  # round robin: both replicas got budgeted requests


def test_openai_client_extra_body_budget_arrives(echo):
    url, seen_a, seen_b = echo
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    for budget in (5, 9):
        reply = client.chat.completions.create(
            model=ECHO_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
            extra_body={"expert_budget": budget, "_seq": 1000 + budget})
        replica, got = reply.choices[0].message.content.split(":")
        assert (replica, int(got)) in {("a", budget), ("b", budget)}
        assert find(seen_a, seen_b, 1000 + budget)["body"]["expert_budget"] == budget


def test_budget_header_is_not_forwarded(echo):
    url, seen_a, seen_b = echo
    resp = post(url, "/v1/chat/completions", chat_body(2000, expert_budget=11),
                headers={"X-Expert-Budget": "7", "X-Request-Id": "req-budget-2000"})
    assert resp.status_code == 200, resp.text
    got = find(seen_a, seen_b, 2000)
    assert "x-expert-budget" not in got["headers"]
    assert got["body"]["expert_budget"] == 11
    # allow-listed headers do pass: the request id, and the caller's Authorization
    assert got["headers"].get("x-request-id") == "req-budget-2000"
    assert got["headers"].get("authorization") == f"Bearer {API_KEY}"


def test_router_rejects_requests_without_the_api_key(echo):
    url, seen_a, seen_b = echo
    before = len(seen_a) + len(seen_b)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(f"{url}/v1/chat/completions", json=chat_body(3000, expert_budget=4),
                          headers=headers, timeout=30)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["code"] == "invalid_api_key"
    assert len(seen_a) + len(seen_b) == before


# ---- the budget each request is served with (real base-serve replicas) ------------------------

@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    from base_sglang.server.app import create_app
    from base_sglang.server.backends import create_backend
    from base_sglang.server.settings import Settings
    from base_sglang.testing.models import create_tiny_moe

    model_dir = create_tiny_moe(tmp_path_factory.mktemp("tiny-moe"))
    settings = Settings(model=str(model_dir), device="cpu", default_budget=str(DEFAULT_BUDGET),
                        min_budget=1, max_budget=8, api_key=API_KEY, max_running_requests=4)
    apps = [create_app(create_backend(settings), settings) for _ in range(2)]
    log = tmp_path_factory.mktemp("router-serve") / "router.log"
    with Replica(apps[0], "serve-0") as r0, Replica(apps[1], "serve-1") as r1:
        with Router([r0.url, r1.url], log) as router:
            models = httpx.get(f"{router.url}/v1/models", timeout=10,
                               headers={"Authorization": f"Bearer {API_KEY}"}).json()
            yield router.url, [r0.url, r1.url], models["data"][0]["id"], apps


def served_budget(resp: httpx.Response):
    assert resp.status_code == 200, resp.text
    return resp.json()["usage"]["expert_budget"]


def applied_budgets(apps) -> list[Counter]:
    return [Counter(app.state.metrics.budgets) for app in apps]


def test_served_budget_is_the_body_budget_through_the_router(serve):
    url, _, model, apps = serve
    before = applied_budgets(apps)
    sent = (1, 2, 3, 2, 1, 3)
    for budget in sent:
        body = {"model": model, "prompt": "hello", "max_tokens": 2, "expert_budget": budget}
        assert served_budget(post(url, "/v1/completions", body)) == budget
    # each replica applied the budgets it was sent (round robin: both served some)
    per_replica = [after - b for after, b in zip(applied_budgets(apps), before)]
    assert all(sum(c.values()) > 0 for c in per_replica)
    assert per_replica[0] + per_replica[1] == Counter(str(b) for b in sent)
    chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "expert_budget": 2}
    assert served_budget(post(url, "/v1/chat/completions", chat)) == 2
    chat["expert_budget"] = "dense"
    assert served_budget(post(url, "/v1/chat/completions", chat)) == "dense"


def test_openai_client_budget_through_the_router(serve):
    url, _, model, _ = serve
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    reply = client.completions.create(model=model, prompt="hello", max_tokens=2,
                                      extra_body={"expert_budget": 3})
    assert reply.usage.model_extra["expert_budget"] == 3


def test_budget_header_applies_direct_but_not_through_the_router(serve):
    url, replicas, model, _ = serve
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    header = {"X-Expert-Budget": "2"}
    assert served_budget(post(replicas[0], "/v1/completions", body, header)) == 2
    assert served_budget(post(url, "/v1/completions", body, header)) == DEFAULT_BUDGET


def test_out_of_range_budget_error_passes_through_the_router(serve):
    url, _, model, _ = serve
    resp = post(url, "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 2,
                                         "expert_budget": 99})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "expert_budget"
