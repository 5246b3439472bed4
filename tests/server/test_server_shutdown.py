"""SIGTERM with in-flight streams, on a real base-serve process: stop accepting, drain until
--shutdown-timeout, then end what is left with an error event and exit 0; a second signal exits
at once. And the start-up log says what is served."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from base_sglang.engine import DEFAULT_MODEL_DIR

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL_DIR / "config.json").is_file(),
                                reason="the embedded proxy model is not installed")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = _port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "base_sglang.server", "--port", str(self.port),
             "--num-threads", "1", "--served-model-name", "proxy-moe", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 90
        while True:
            assert self.proc.poll() is None, "".join(self.lines)
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def serve():
    started = []

    def start(*args):
        started.append(Server(*args))
        return started[-1]

    yield start
    for s in started:
        s.close()


def _stream(url, max_tokens, events):
    """Collect one stream's SSE data payloads into events (a list shared with the test)."""
    body = {"model": "proxy-moe", "prompt": "def fibonacci(n):", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    except httpx.HTTPError as exc:  # a stream must never end this way
        events.append(f"CONNECTION ERROR {exc}")


def _wait_for(events, n, timeout=30):
    deadline = time.monotonic() + timeout
    while len(events) < n:
        assert time.monotonic() < deadline, events
        time.sleep(0.02)


def test_startup_log_names_model_policy_budget_device(serve):
    s = serve("--default-budget", "8", "--shutdown-timeout", "1")
    log = "".join(s.lines)
    for part in ("model=", "proxy-moe", "policy=base", "default_budget=8", "device=cpu",
                 "dtype=float32", "threads=1", "predictor=", "shutdown timeout 1 s",
                 "request body 8388608 bytes"):
        assert part in log, part


def test_sigterm_drains_in_flight_streams_then_exits_0(serve):
    s = serve("--shutdown-timeout", "60")
    streams = [[] for _ in range(3)]
    threads = [threading.Thread(target=_stream, args=(s.url, 40, ev)) for ev in streams]
    for t in threads:
        t.start()
    for ev in streams:
        _wait_for(ev, 2)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):  # it stopped accepting: probes and balancers move on
        httpx.get(f"{s.url}/health", timeout=2)
    for t in threads:
        t.join(timeout=60)
    assert s.proc.wait(timeout=30) == 0
    for ev in streams:  # every stream ran to its end: 40 tokens, finish "length", [DONE]
        assert ev[-1] == "[DONE]", ev[-3:]
        chunks = [json.loads(e) for e in ev[:-1]]
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


def test_the_deadline_ends_what_is_left_with_an_error_event(serve):
    s = serve("--shutdown-timeout", "1")
    ev: list[str] = []
    t = threading.Thread(target=_stream, args=(s.url, 1500, ev))  # far longer than 1 s
    t.start()
    _wait_for(ev, 2)
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    assert s.proc.wait(timeout=30) == 0 and time.monotonic() - t0 < 15
    assert ev[-1] == "[DONE]" and "CONNECTION ERROR" not in " ".join(ev)
    err = json.loads(ev[-2])["error"]
    assert err["code"] == "shutting_down" and "shutting down" in err["message"]
    assert 2 <= len(ev) - 2 < 1500  # it was cut, not completed


def test_a_second_signal_exits_at_once(serve):
    s = serve("--shutdown-timeout", "120")
    ev: list[str] = []
    t = threading.Thread(target=_stream, args=(s.url, 1500, ev), daemon=True)
    t.start()
    _wait_for(ev, 2)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert s.proc.poll() is None  # still draining
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=10) == 128 + signal.SIGTERM and time.monotonic() - t0 < 5
