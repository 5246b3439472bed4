"""Serving throughput of the native engine behind base-serve: tokens/s vs concurrency and budget.

    python benchmarks/bench_serving.py                       # embedded proxy model if present
    python benchmarks/bench_serving.py --model DIR --concurrency 1 8 32 --budgets dense 8

Starts `python -m base_sglang.server` in a subprocess (policy base, max 32 running requests), then for
each budget and concurrency C runs C closed-loop clients, each sending `--rounds` streaming
completions (distinct prompts, greedy, ignore_eos, --max-tokens tokens). One warm-up request per
level is not counted. The whole grid is run --repeats times, interleaved (the machine may be shared),
and each level reports the median tokens/s over the repeats (all repeats are kept in the JSON). Reports output tokens/s over the wall time of the level, mean time to first
token, mean request latency, the mean experts executed per MoE layer (from the usage objects), and
tokens per CPU-second of the server process (user + system time from /proc): on a shared machine wall
time swings with the neighbours' load, CPU time much less.
Without the proxy model it builds a random Qwen3-MoE of the proxy's shape (hidden 256, 6 layers, 32
experts, top-4, vocab 8192) and says so in the results.
Writes serving_cpu.csv / .json under --out with CPU name, commit, load average and settings.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from base_sglang.engine.config import DEFAULT_MODEL_DIR


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def commit() -> str:
    if os.environ.get("BASE_COMMIT"):  # the device machine gets the tree without .git
        return os.environ["BASE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def resolve_model(arg: str | None) -> tuple[str, str]:
    if arg:
        return arg, Path(arg).name
    if (DEFAULT_MODEL_DIR / "config.json").is_file():
        return str(DEFAULT_MODEL_DIR), "proxy-moe (embedded, trained)"
    from base_sglang.testing.models import create_tiny_moe

    path = create_tiny_moe(Path(tempfile.mkdtemp()) / "proxy-shaped", hidden_size=256, num_layers=6,
                           num_experts=32, top_k=4, vocab_size=8192)
    return str(path), "random Qwen3-MoE of the proxy's shape (H256, 6 layers, E32, top-4, V8192)"


def start_server(model: str, port: int, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "base_sglang.server", "--model", model, "--port", str(port),
           "--served-model-name", "bench", "--policy", args.policy, "--log-level", "warning",
           "--max-running-requests", str(max(args.concurrency)), "--device", "cpu"]
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    return wait_healthy(subprocess.Popen(cmd), port)


def wait_healthy(proc: subprocess.Popen, port: int, name: str = "server",
                 timeout_s: float = 300) -> subprocess.Popen:
    """Poll /health on loopback until 200; SystemExit when the process dies or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"{name} did not become healthy")


async def one_request(client: httpx.AsyncClient, prompt: str, budget: str, max_tokens: int):
    body = {"model": "bench", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "expert_budget": budget,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, usage = None, None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and chunk.get("choices") and chunk["choices"][0]["text"]:
                ttft = time.perf_counter() - t0
            if chunk.get("usage") and not chunk.get("choices"):
                usage = chunk["usage"]
    return ttft or 0.0, time.perf_counter() - t0, usage


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_level(url: str, concurrency: int, budget: str, args, pid: int) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await one_request(client, "warm up", budget, 4)
        cpu0 = cpu_seconds(pid)

        async def worker(w: int):
            return [await one_request(client, f"Request {w}-{r}: the quick brown fox", budget,
                                      args.max_tokens) for r in range(args.rounds)]

        t0 = time.perf_counter()
        per_worker = await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(pid) - cpu0
    results = [x for w in per_worker for x in w]
    tokens = sum(u["completion_tokens"] for _, _, u in results)
    experts = [u["experts_per_layer"] for _, _, u in results if u["experts_per_layer"]]
    dense = [u["experts_per_layer_dense"] for _, _, u in results if u["experts_per_layer_dense"]]
    return {"concurrency": concurrency, "budget": budget, "requests": len(results),
            "output_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2), "server_cpu_s": round(cpu, 3),
            "tokens_per_cpu_s": round(tokens / cpu, 2),
            "mean_ttft_s": round(sum(t for t, _, _ in results) / len(results), 4),
            "mean_latency_s": round(sum(lat for _, lat, _ in results) / len(results), 4),
            "experts_per_layer": round(sum(experts) / len(experts), 2) if experts else None,
            "experts_per_layer_dense": round(sum(dense) / len(dense), 2) if dense else None}


def median_row(reps: list[dict]) -> dict:
    """The repeat with the median tokens/s (its other fields stay consistent with it)."""
    ordered = sorted(reps, key=lambda r: r["tokens_per_s"])
    row = dict(ordered[len(ordered) // 2])
    row["tokens_per_s_all"] = [r["tokens_per_s"] for r in reps]
    cpu = sorted(r["tokens_per_cpu_s"] for r in reps)
    row["tokens_per_cpu_s"] = cpu[len(cpu) // 2]  # median on its own
    row["tokens_per_cpu_s_all"] = [r["tokens_per_cpu_s"] for r in reps]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--policy", default="base")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--budgets", nargs="+", default=["dense", "8"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="serving_cpu")
    args = ap.parse_args()
    model, model_desc = resolve_model(args.model)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load_before = os.getloadavg()
    proc = start_server(model, port, args)
    runs: dict[tuple[str, int], list[dict]] = {}
    try:
        for rep in range(args.repeats):
            for budget in args.budgets:
                for c in args.concurrency:
                    row = asyncio.run(run_level(f"http://127.0.0.1:{port}", c, budget, args,
                                                proc.pid))
                    runs.setdefault((budget, c), []).append(row)
                    print(f"[{rep + 1}/{args.repeats}] budget={budget:>6} C={c:>3} "
                          f"{row['tokens_per_s']:8.1f} tok/s {row['tokens_per_cpu_s']:8.1f} tok/cpu-s",
                          flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    rows = [median_row(reps) for reps in runs.values()]
    print(f"{'budget':>7} {'C':>3} {'tok/s':>8} {'tok/cpu-s':>9} {'ttft s':>7} {'lat s':>6} "
          f"{'experts/layer':>14} {'dense':>6}")
    for r in rows:
        print(f"{r['budget']:>7} {r['concurrency']:>3} {r['tokens_per_s']:8.1f} "
              f"{r['tokens_per_cpu_s']:9.1f} "
              f"{r['mean_ttft_s']:7.3f} {r['mean_latency_s']:6.2f} {r['experts_per_layer']!s:>14} "
              f"{r['experts_per_layer_dense']!s:>6}")
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "commit": commit(), "model": model_desc,
            "policy": args.policy, "max_tokens": args.max_tokens, "rounds": args.rounds,
            "num_threads": args.num_threads, "repeats": args.repeats, "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    all_runs = [r for reps in runs.values() for r in reps]
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows, "runs": all_runs},
                                                     indent=2))
    with open(out / f"{args.tag}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "cpu", "commit", "model"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "cpu": meta["cpu"], "commit": meta["commit"], "model": model_desc})
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
