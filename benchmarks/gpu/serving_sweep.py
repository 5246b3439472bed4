"""`sglang.bench_serving --backend sglang-oai` over concurrencies x budgets, in one process.

    python3 benchmarks/gpu/serving_sweep.py --base-url http://127.0.0.1:8000 --flavor base-serve \
        --model NAME --tokenizer DIR --out OUT [--concurrency 16 32 64] [--budgets dense 16 10]
    python3 benchmarks/gpu/serving_sweep.py --summary --out OUT     # the table of OUT

Each run is SGLang's own bench_serving CLI (its `cli_main`, called with the argv that
`python -m sglang.bench_serving` would get; one import for all runs): the random dataset (token
ids sampled from --dataset-path, a ShareGPT-format file of random words written here, since the
device has no network), --num-prompts = --prompts-per-concurrency x concurrency, the per-request
budget through --extra-request-body (base-serve: {"expert_budget": N}; SGLang's server:
{"custom_params": {"expert_budget": N}}; 0.5.17's bench_serving merges that dict into every
request body). Results are appended to OUT/bench_serving.jsonl (bench_serving's own records,
tagged flavor/budget/concurrency) and summarised into OUT/serving_summary.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

JSONL, SUMMARY = "bench_serving.jsonl", "serving_summary.json"
KEYS = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms",
        "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_tpot_ms",
        "completed", "duration")


def write_dataset(path: Path, vocab: int, n: int = 512, words: int = 400, seed: int = 0) -> Path:
    """ShareGPT-format conversations of random synthetic-tokenizer words ("t<i>"): diverse prompts
    (identical prompts would decode identical tokens and collapse the routed union)."""
    rng = random.Random(seed)
    convs = [{"conversations": [
        {"from": "human", "value": " ".join(f"t{rng.randrange(1, vocab)}" for _ in range(words))},
        {"from": "gpt", "value": " ".join(f"t{rng.randrange(1, vocab)}" for _ in range(8))}]}
        for _ in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(convs))
    return path


def extra_body(flavor: str, budget: str) -> str | None:
    if budget == "dense":
        return None
    b = int(budget)
    return json.dumps({"expert_budget": b} if flavor == "base-serve"
                      else {"custom_params": {"expert_budget": b}})


def bench_argv(args, flavor, budget, conc, dataset) -> list[str]:
    argv = ["--backend", "sglang-oai", "--base-url", args.base_url, "--model", args.model,
            "--tokenizer", args.tokenizer, "--dataset-name", "random",
            "--dataset-path", str(dataset), "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--random-range-ratio", "1.0",
            "--num-prompts", str(args.prompts_per_concurrency * conc),
            "--max-concurrency", str(conc), "--seed", str(args.seed),
            "--warmup-requests", "1", "--disable-tqdm", "--ready-check-timeout-sec", "30",
            "--output-file", str(Path(args.out) / JSONL), "--tag", f"{flavor}/{budget}/c{conc}"]
    body = extra_body(flavor, budget)
    if body:
        argv += ["--extra-request-body", body]
    return argv


# Modules 0.5.17's bench_serving imports at module level only for datasets this sweep never
# loads (sglang/benchmark/datasets/mmmu.py: `from datasets import load_dataset`, the HF hub datasets
# library with pyarrow + pandas, ~60 MB; image.py: `from PIL import Image`). When the environment
# lacks them they are stood in by modules that raise on any use; the summary lists them.
OPTIONAL_IMPORTS = ("datasets", "PIL")


class _Unavailable:
    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __call__(self, *a, **kw):
        raise RuntimeError(f"{self._name} is not installed here (stood in by serving_sweep.py: "
                           "only datasets this sweep does not use need it)")


def import_bench_serving():
    """sglang's bench_serving module; (module, stood-in module names)."""
    import importlib
    import types

    stood_in = []
    for _ in range(len(OPTIONAL_IMPORTS) + 1):
        try:
            try:
                return importlib.import_module("sglang.benchmark.serving"), stood_in
            except ModuleNotFoundError as exc:
                if exc.name != "sglang.benchmark":
                    raise
                return importlib.import_module("sglang.bench_serving"), stood_in
        except ModuleNotFoundError as exc:
            top = (exc.name or "").split(".")[0]
            if top not in OPTIONAL_IMPORTS or top in stood_in:
                raise
            mod = types.ModuleType(top)
            mod.__getattr__ = _Unavailable(top).__getattr__
            sys.modules[top] = mod
            stood_in.append(top)
            for name in [m for m in sys.modules if m.startswith("sglang.benchmark")]:
                del sys.modules[name]  # re-import the half-imported package
    raise RuntimeError("bench_serving did not import")


def warm_argv(args, conc: int, dataset: Path, scratch: Path) -> list[str]:
    """bench_serving arguments of a warm-up run: dense, one prompt per slot, into a scratch file."""
    argv = bench_argv(args, args.flavor, "dense", conc, dataset)
    argv[argv.index("--num-prompts") + 1] = str(conc)
    argv[argv.index("--output-file") + 1] = str(scratch)
    argv[argv.index("--tag") + 1] = f"warmup/c{conc}"
    return argv


def warm(bs, args, dataset: Path) -> None:
    """One unrecorded dense pass per concurrency before anything is measured: the first prefill of
    each batch shape compiles Triton kernels (seen on the H200: the first measured run's TTFT was
    8x the later ones'), which would otherwise count against whichever budget runs first."""
    scratch = Path(args.out) / "_warmup.jsonl"
    for conc in args.concurrency:
        sys.argv = ["sglang.bench_serving", *warm_argv(args, conc, dataset, scratch)]
        t0 = time.perf_counter()
        try:
            bs.cli_main()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the measured runs report failures
            print(f"[sweep] warm-up c{conc} failed: {exc!r}", flush=True)
        print(f"[sweep] warm-up c{conc} (not recorded): {time.perf_counter() - t0:.1f} s", flush=True)
    scratch.unlink(missing_ok=True)


def sweep(args) -> int:
    # no network on the device: without this, bench_serving's hub look-ups for the model name
    # (check_chat_template) wait on timeouts, ~45 s per run (measured on CPU)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bs, stood_in = import_bench_serving()
    if stood_in:
        print(f"[sweep] stood in for {stood_in} (not installed; unused by the random dataset)",
              flush=True)
    dataset = write_dataset(Path(args.out) / "_sharegpt_random.json", args.vocab)
    t_start = time.perf_counter()
    warm(bs, args, dataset)
    done = 0
    for budget in args.budgets:
        for conc in args.concurrency:
            if time.perf_counter() - t_start > args.time_budget:
                print(f"[sweep] time budget {args.time_budget:.0f} s spent: skipping "
                      f"{args.flavor}/{budget}/c{conc}", flush=True)
                continue
            argv = bench_argv(args, args.flavor, budget, conc, dataset)
            print(f"[sweep] python3 -m sglang.bench_serving {' '.join(argv)}", flush=True)
            sys.argv = ["sglang.bench_serving", *argv]
            t0 = time.perf_counter()
            try:
                bs.cli_main()
                done += 1
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - report and go on
                print(f"[sweep] {args.flavor}/{budget}/c{conc} failed: {exc!r}", flush=True)
            print(f"[sweep] {args.flavor}/{budget}/c{conc}: {time.perf_counter() - t0:.1f} s",
                  flush=True)
    dataset.unlink(missing_ok=True)
    summarize(Path(args.out), stood_in)
    return 0 if done else 1


def summarize(out: Path, stood_in: list[str] | None = None) -> dict:
    """bench_serving.jsonl -> serving_summary.json rows (+ a printed table with x dense)."""
    path = out / JSONL
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            flavor, budget, conc = (rec.get("tag") or "?/?/c0").split("/")
            rows.append({"server": flavor, "budget": budget, "concurrency": int(conc[1:]),
                         **{k: rec.get(k) for k in KEYS}})
    dense = {(r["server"], r["concurrency"]): r["output_throughput"] for r in rows
             if r["budget"] == "dense"}
    for r in rows:
        d = dense.get((r["server"], r["concurrency"]))
        r["x_dense"] = round(r["output_throughput"] / d, 3) if d and r["output_throughput"] else None
    old = json.loads((out / SUMMARY).read_text()) if (out / SUMMARY).is_file() else {}
    summary = {"rows": rows, "run_info": common.run_info(),
               "stood_in_modules": sorted(set(old.get("stood_in_modules", [])) | set(stood_in or [])),
               "note": "sglang bench_serving --backend sglang-oai, random dataset, dummy weights"}
    common.write_json(out / SUMMARY, summary)
    print(common.format_table(
        ["server", "budget", "conc", "out tok/s", "x dense", "TTFT ms", "ITL ms", "p99 ITL",
         "done"],
        [[r["server"], r["budget"], r["concurrency"], r["output_throughput"], r["x_dense"],
          r["median_ttft_ms"], r["median_itl_ms"], r["p99_itl_ms"], r["completed"]]
         for r in rows]))
    return summary


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--summary", action="store_true", help="only summarise OUT/bench_serving.jsonl")
    p.add_argument("--base-url")
    p.add_argument("--flavor", choices=("base-serve", "sglang"))
    p.add_argument("--model")
    p.add_argument("--tokenizer")
    p.add_argument("--concurrency", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--budgets", nargs="+", default=["dense", "16", "10"])
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prompts-per-concurrency", type=int, default=2)
    p.add_argument("--vocab", type=int, default=common.QWEN3_30B_A3B["vocab_size"])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--time-budget", type=float, default=150.0, help="seconds for all runs")
    args = p.parse_args(argv)
    if args.summary:
        return args
    missing = [f"--{n.replace('_', '-')}" for n in ("base_url", "flavor", "model", "tokenizer")
               if not getattr(args, n)]
    if missing:
        p.error(f"missing {', '.join(missing)}")
    for b in args.budgets:
        if b != "dense" and not (b.isdigit() and int(b) >= 1):
            p.error(f"--budgets: {b!r} is neither 'dense' nor an integer >= 1")
    if any(c < 1 for c in args.concurrency) or args.prompts_per_concurrency < 1:
        p.error("--concurrency and --prompts-per-concurrency: integers >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summary:
        summarize(Path(args.out))
        return 0
    return sweep(args)


if __name__ == "__main__":
    sys.exit(main())
