"""Decode-step time of the native engine (no HTTP) vs batch size and expert budget (CPU or CUDA).

    python benchmarks/bench_engine.py                  # embedded proxy model, policy base
    python benchmarks/bench_engine.py --policy gate_sum --batch 1 8 32 --budgets dense 16 8 4
    python benchmarks/bench_engine.py --device cuda --dtype bfloat16 --tag engine_h200   # GPU

For each budget and batch size B it admits B requests (distinct prompts, greedy, ignore_eos), runs
--steps decode steps and takes the median step time over them (the first two steps are warm-up).
The grid runs --repeats times, interleaved, and each cell reports the smallest of its medians (the
run least disturbed by other load on a shared machine; all medians are kept in the JSON), the implied
decode tokens/s = B / step time, and the distinct experts executed per MoE layer.
Writes engine_cpu.csv / .json under --out with CPU name, commit, load average and settings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time
from pathlib import Path

import torch

from base_sglang.core.budget import budget_label
from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams
from base_sglang.engine.config import DEFAULT_MODEL_DIR


def measure(engine: LLMEngine, batch: int, budget: int | str, steps: int) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=steps + 3, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"Request {i}: the quick brown fox", params, budget)
    engine.stats.recent.clear()
    while engine.has_unfinished():
        engine.step()
    decode = engine.stats.decode_steps()[2:steps + 2]
    ms = statistics.median(s.duration_s for s in decode) * 1e3
    executed = statistics.mean(s.mean_executed for s in decode)
    routed = statistics.mean(s.mean_routed for s in decode)
    label = budget_label(engine.resolve_budget(budget), engine.num_experts)
    return {"batch": batch, "budget": label, "steps": len(decode),
            "median_step_ms": round(ms, 2), "tokens_per_s": round(batch / ms * 1e3, 1),
            "experts_per_layer": round(executed, 2), "experts_per_layer_dense": round(routed, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--policy", default="base")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--budgets", nargs="+", default=["dense", "16", "8"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="engine_cpu")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, policy=args.policy, device=args.device,
                                    dtype=args.dtype,
                                    max_running_requests=max(args.batch),
                                    num_threads=args.num_threads))
    measure(engine, max(args.batch), "dense", 4)  # warm-up
    load_before = os.getloadavg()
    cells: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for budget in args.budgets:
            b = budget if budget == "dense" else int(budget)
            for batch in args.batch:
                cells.setdefault((budget, batch), []).append(measure(engine, batch, b, args.steps))
    rows = []
    for reps in cells.values():
        r = dict(min(reps, key=lambda x: x["median_step_ms"]))
        r["median_step_ms_all"] = [x["median_step_ms"] for x in reps]
        rows.append(r)
        print(f"budget={r['budget']:>6} B={r['batch']:>3} {r['median_step_ms']:8.2f} ms/step "
              f"{r['tokens_per_s']:8.1f} tok/s  experts/layer {r['experts_per_layer']} "
              f"(dense {r['experts_per_layer_dense']})  medians {r['median_step_ms_all']}",
              flush=True)
    from bench_serving import commit, cpu_name  # same folder

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else None
    meta = {"cpu": cpu_name(), "gpu": gpu, "cores": os.cpu_count(), "commit": commit(),
            "device": args.device, "dtype": args.dtype,
            "triton_path": bool(getattr(engine.runner, "patch", None) and engine.runner.patch.use_kernels),
            "model": Path(args.model).name, "policy": args.policy, "steps": args.steps, "repeats": args.repeats,
            "num_threads": args.num_threads, "torch": torch.__version__,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    with open(out / f"{args.tag}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], "cpu", "commit", "model", "policy"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "cpu": meta["cpu"], "commit": meta["commit"], "model": meta["model"],
                        "policy": args.policy})
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
