"""Disconnects free their slot, engine failures stay inside one request, /metrics, /health, CLI."""

import time

import httpx
import pytest

from base_sglang.server.__main__ import build_parser, main
from base_sglang.server.settings import Settings

MODEL = "tiny"  # served_model_name in conftest.py

LONG = {"model": MODEL, "prompt": "Hello", "max_tokens": 1000, "temperature": 0,
        "ignore_eos": True}


def wait_idle(server, timeout=10.0) -> float:
    start = time.monotonic()
    while True:
        s = server.backend.stats()
        if s["num_requests_running"] == 0 and s["num_requests_waiting"] == 0 \
                and server.backend.async_engine.num_live == 0:
            return time.monotonic() - start
        assert time.monotonic() - start < timeout, f"request still holds its slot: {s}"
        time.sleep(0.05)


def test_stream_disconnect_aborts_and_frees_the_slot(server):
    wait_idle(server)
    before = server.engine.stats.decode_tokens
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True},
                      timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few tokens arrived, then the client leaves
        assert sum(ln.startswith("data: ") for ln in got) >= 2
        assert server.backend.stats()["num_requests_running"] == 1
    wait_idle(server)
    assert server.engine.stats.decode_tokens - before < 900  # stopped long before max_tokens


def test_non_stream_disconnect_aborts_too(server):
    wait_idle(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/completions", json=LONG, timeout=httpx.Timeout(60, read=0.1))
    wait_idle(server)


def test_engine_failure_stays_inside_the_request(server, monkeypatch):
    wait_idle(server)
    runner = server.engine.runner
    original = runner.decode
    calls = {"n": 0}

    def failing_decode(seqs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected fault")
        return original(seqs)

    monkeypatch.setattr(runner, "decode", failing_decode)
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    err = r.json()["error"]
    assert r.status_code == 500 and err["code"] == "engine_error"
    assert "injected fault" not in err["message"] and "error id" in err["message"]  # no internals
    assert server.app.state.metrics.responses[("completions", "500")] >= 1
    assert server.app.state.metrics.finishes["error"] >= 1
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert runner.kv.num_rows == 0
    wait_idle(server)


def test_queue_full_is_503(server, monkeypatch):
    wait_idle(server)
    monkeypatch.setattr(server.engine.scheduler, "max_running", 1)
    monkeypatch.setattr(server.engine.scheduler, "max_waiting", 0)
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**LONG, "stream": True},
                      timeout=60) as r:
        lines = r.iter_lines()  # keep it: a dropped iterator closes the connection
        next(lines)
        r2 = httpx.post(f"{server.url}/v1/completions", json={**LONG, "max_tokens": 2})
        assert r2.status_code == 503 and r2.json()["error"]["code"] == "queue_full"
        assert any(next(lines).startswith("data: ") for _ in range(2))  # the first carries on
    wait_idle(server)


def test_metrics_and_health(server):
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 3, "temperature": 0,
            "expert_budget": 2, "ignore_eos": True}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(samples['base_requests_total{endpoint="completions",status="200"}']) >= 1
    assert float(samples['base_request_budget_total{budget="2"}']) >= 1
    assert float(samples["base_generation_tokens_total"]) >= 3
    assert float(samples["base_decode_steps_total"]) >= 2
    assert float(samples['base_experts_executed_total{layer="0"}']) >= 2
    assert float(samples['base_decode_batch_budget_bucket{le="2"}']) >= 2  # a histogram
    assert float(samples['base_decode_batch_size_bucket{le="+Inf"}']) >= 2
    assert float(samples['base_request_finish_total{reason="length"}']) >= 1
    for name in ("request_latency_seconds", "time_to_first_token_seconds",
                 "inter_token_latency_seconds", "request_queue_time_seconds"):
        assert float(samples[f'base_{name}_bucket{{le="+Inf"}}']) >= 1, name
        assert float(samples[f"base_{name}_count"]) >= 1, name
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL


def test_cli_names_model_when_checkpoint_missing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1  # one line, no traceback
    assert err.startswith("base-serve: error: --model") and str(tmp_path / "missing") in err


@pytest.mark.parametrize("argv,env,named", [
    (["--default-budget", "foo"], {}, "--default-budget (BASE_DEFAULT_BUDGET)"),
    (["--default-budget", "0"], {}, "--default-budget (BASE_DEFAULT_BUDGET)"),
    (["--policy", "nope"], {}, "--policy (BASE_POLICY)"),
    (["--port", "70000"], {}, "--port (BASE_PORT)"),
    (["--device", "gpu"], {}, "--device (BASE_DEVICE)"),
    (["--min-budget", "0"], {}, "--min-budget (BASE_MIN_BUDGET)"),
    ([], {"BASE_DEFAULT_BUDGET": "lots"}, "BASE_DEFAULT_BUDGET"),
    ([], {"BASE_PORT": "http"}, "BASE_PORT"),
    ([], {"BASE_MAX_RUNNING_REQUESTS": "0"}, "BASE_MAX_RUNNING_REQUESTS"),
])
def test_cli_bad_flag_or_variable_is_one_line_naming_it(argv, env, named, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(argv)  # every check here runs before the model loads
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"base-serve: error: {named}: ")


def test_cli_budget_above_the_models_experts_is_named(server_model_dir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(server_model_dir), "--default-budget", "99"])
    err = capsys.readouterr().err.splitlines()[-1]  # after transformers' loading progress bar
    assert exc.value.code == 2
    assert err.startswith("base-serve: error: --default-budget (BASE_DEFAULT_BUDGET): 99 exceeds")


def test_cli_native_refuses_unknown_flags(server_model_dir):
    with pytest.raises(SystemExit) as exc:
        main(["--model", str(server_model_dir), "--tp-size", "2"])
    assert exc.value.code == 2  # argparse's usage error


def test_cli_defaults_come_from_environment(monkeypatch):
    monkeypatch.setenv("BASE_DEFAULT_BUDGET", "4")
    monkeypatch.setenv("BASE_PORT", "9123")
    args = build_parser(Settings()).parse_args([])
    assert args.default_budget == "4" and args.port == 9123 and args.host == "127.0.0.1"
    assert build_parser(Settings()).parse_args(["--port", "1"]).port == 1
