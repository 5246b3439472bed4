"""base-serve under the load generators SGLang and vLLM users run: `python -m sglang.bench_serving
--backend sglang-oai` and vLLM's `vllm bench serve` client, unmodified, on the random dataset,
dense vs a per-request budget sent as those tools send extra fields.

    bash benchmarks/setup_serving_clients.sh          # once: prints the two variables to export
    export BENCH_CLIENT_PYTHON=... BENCH_VLLM_PATH=...
    python benchmarks/bench_serving_clients.py        # embedded proxy model, C = 1 4 8
    python benchmarks/bench_serving_clients.py --concurrency 1 4 --budgets dense 8 4

Starts base-serve in a subprocess (the embedded proxy model, policy base, dense by default, one
torch thread) and, for each tool, budget and concurrency C, runs the tool with --max-concurrency C
and C * --prompts-per-slot requests (at least 8), fixed --input-len / --output-len, greedy,
ignore_eos, one warm-up request. The budget travels in the request body: sglang.bench_serving
`--extra-request-body '{"expert_budget": B}'`, vllm `--extra-body '{"expert_budget": B}'`
(dense = "dense"); the server's /metrics confirms every request ran under it.
Datasets: SGLang's `random` (text from its ShareGPT-format file, repeated / cut to the length:
here a local file built from base_sglang/data/heldout.txt, as no hub is reachable) and vLLM's
`random` (random token ids). Each tool's own summary JSON is kept; the table and the CSV/JSON
under --out carry output tok/s, mean/median/p99 TTFT and ITL, with CPU name, commit and load.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import commit, cpu_name, wait_healthy  # noqa: E402

from base_sglang.engine.config import DEFAULT_MODEL_DIR  # noqa: E402

MODEL = "proxy-moe"
HELDOUT = Path(__file__).resolve().parents[1] / "base_sglang" / "data" / "heldout.txt"
FIELDS = ["tool", "budget", "concurrency", "num_prompts", "completed", "duration_s",
          "output_tok_s", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
          "median_itl_ms", "p99_itl_ms", "requests_under_budget"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "base_sglang.server", "--port", str(port), "--served-model-name",
           MODEL, "--num-threads", str(args.num_threads), "--log-level", "warning",
           "--max-running-requests", str(max(16, max(args.concurrency)))]
    return wait_healthy(subprocess.Popen(cmd), port, "base-serve")


def sharegpt_file(path: Path, n: int = 64) -> Path:
    """A ShareGPT-format JSON (what sglang's `random` dataset samples text from) of held-out
    text: n conversations of two turns, consecutive 1500-character pieces of the file."""
    text = HELDOUT.read_text()
    pieces = [text[i:i + 1500] for i in range(0, 1500 * 2 * n, 1500)]
    rows = [{"conversations": [{"from": "human", "value": pieces[2 * k]},
                               {"from": "gpt", "value": pieces[2 * k + 1]}]} for k in range(n)]
    path.write_text(json.dumps(rows))
    return path


def budget_count(url: str, budget: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'base_request_budget_total{{budget="{budget}"}}'):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def sglang_cmd(url, c, n, budget, args, work: Path) -> tuple[list[str], Path]:
    out = work / f"sglang_{budget}_{c}.jsonl"
    return [args.client_python, "-m", "sglang.bench_serving", "--backend", "sglang-oai",
            "--base-url", url, "--model", MODEL, "--tokenizer", str(DEFAULT_MODEL_DIR),
            "--dataset-name", "random", "--dataset-path", str(work / "sharegpt.json"),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "1", "--num-prompts", str(n), "--max-concurrency", str(c),
            "--seed", "1", "--warmup-requests", "1", "--disable-tqdm",
            "--extra-request-body", json.dumps({"expert_budget": _budget(budget)}),
            "--output-file", str(out)], out


def vllm_cmd(url, c, n, budget, args, work: Path) -> tuple[list[str], Path]:
    out = work / f"vllm_{budget}_{c}.json"
    shim = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
            "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
            "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
    return [args.client_python, "-c", shim, "--backend", "vllm", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer",
            str(DEFAULT_MODEL_DIR), "--dataset-name", "random", "--random-input-len",
            str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-range-ratio", "0", "--num-prompts", str(n), "--max-concurrency", str(c),
            "--seed", "1", "--num-warmups", "1", "--ignore-eos", "--temperature", "0",
            "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", "50,99",
            "--extra-body", json.dumps({"expert_budget": _budget(budget)}), "--save-result",
            "--result-dir", str(work), "--result-filename", out.name], out


def _budget(b: str):
    return "dense" if b == "dense" else int(b)


SUMMARY_KEYS = {"completed": "completed", "duration_s": "duration",
                "output_tok_s": "output_throughput"} | {
    k: k for k in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
                   "median_itl_ms", "p99_itl_ms")}  # both tools write these names


def run_one(tool, url, c, budget, args, work: Path) -> tuple[dict, dict]:
    n = max(8, c * args.prompts_per_slot)
    cmd, out = (sglang_cmd if tool == "sglang" else vllm_cmd)(url, c, n, budget, args, work)
    env = dict(os.environ)
    if tool == "vllm":
        env["PYTHONPATH"] = args.vllm_path
    before = budget_count(url, str(budget))
    log = work / f"{tool}_{budget}_{c}.log"
    with log.open("w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=work,
                            timeout=args.timeout).returncode
    if rc != 0 or not out.is_file():
        raise SystemExit(f"{tool} failed (rc {rc}); see {log}:\n" + log.read_text()[-3000:])
    text = out.read_text().strip()
    raw = json.loads(text.splitlines()[-1] if tool == "sglang" else text)  # JSONL / one JSON
    row = {"tool": tool, "budget": budget, "concurrency": c, "num_prompts": n,
           **{k: raw.get(v) for k, v in SUMMARY_KEYS.items()},
           "requests_under_budget": budget_count(url, str(budget)) - before}
    return row, raw


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--budgets", nargs="+", default=["dense", "8"])
    ap.add_argument("--tools", nargs="+", default=["sglang", "vllm"], choices=["sglang", "vllm"])
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per tool run")
    ap.add_argument("--client-python", default=os.environ.get("BENCH_CLIENT_PYTHON"))
    ap.add_argument("--vllm-path", default=os.environ.get("BENCH_VLLM_PATH"))
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="serving_clients_cpu")
    args = ap.parse_args()
    if not args.client_python or ("vllm" in args.tools and not args.vllm_path):
        raise SystemExit("set BENCH_CLIENT_PYTHON / BENCH_VLLM_PATH (bash "
                         "benchmarks/setup_serving_clients.sh prints them)")
    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        raise SystemExit("the embedded proxy model is not installed")
    work = Path(tempfile.mkdtemp(prefix="bench-clients-"))
    sharegpt_file(work / "sharegpt.json")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    load_before = os.getloadavg()
    server = start_server(port, args)
    rows, raws = [], []
    try:
        for tool in args.tools:
            for budget in args.budgets:
                for c in args.concurrency:
                    row, raw = run_one(tool, url, c, budget, args, work)
                    rows.append(row)
                    raws.append({"tool": tool, "budget": budget, "concurrency": c, "raw": raw})
                    print(f"{tool:>6} budget {budget:>5} C={c:<2} {row['output_tok_s']:8.1f} "
                          f"tok/s  TTFT {row['mean_ttft_ms']:7.1f} ms  ITL "
                          f"{row['mean_itl_ms']:6.2f} ms", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "commit": commit(),
            "model": "proxy-moe (embedded)", "policy": "base", "num_threads": args.num_threads,
            "input_len": args.input_len, "output_len": args.output_len,
            "tools": {"sglang": "sglang.bench_serving 0.5.23 --backend sglang-oai, dataset "
                                "random (local ShareGPT-format heldout text)",
                      "vllm": "vllm 0.33.0 vllm.benchmarks.serve (vllm bench serve), backend "
                              "vllm, dataset random"},
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{args.tag}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows, "raw": raws},
                                                     indent=1, default=str))
    print(f"\n{'tool':>6} {'budget':>6} {'C':>3} {'tok/s':>8} {'TTFT mean':>10} {'p99':>8} "
          f"{'ITL mean':>9} {'p99':>7}")
    for r in rows:
        print(f"{r['tool']:>6} {r['budget']:>6} {r['concurrency']:>3} {r['output_tok_s']:8.1f} "
              f"{r['mean_ttft_ms']:10.1f} {r['p99_ttft_ms']:8.1f} {r['mean_itl_ms']:9.2f} "
              f"{r['p99_itl_ms']:7.2f}")
    print(f"wrote {out / args.tag}.csv/.json (load {load_before} -> {meta['loadavg_after']})")


if __name__ == "__main__":
    main()
