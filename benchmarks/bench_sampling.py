"""CPU cost of constrained decoding and of the sampling controls in the native engine (no HTTP).

    python benchmarks/bench_sampling.py                      # embedded proxy model, B = 1 and 8
    python benchmarks/bench_sampling.py --batch 1 8 32 --repeats 5

For each setting and batch size B it admits B requests (distinct prompts, dense budget), runs
them to the end and times every decode step of LLMEngine.step() on the wall clock (the model
forward, the sampler with its logits processing and grammar masks, and the postprocessing with
the grammar matchers' advance). Reported per setting: decode tokens/s = generated tokens / decode
wall time, wall ms per decode step, and the sampler's share (ms per step spent in Sampler.__call__,
grammar bitmasks included). Settings:
  plain      greedy, ignore_eos, max_tokens
  sampled    temperature 1, top_p 0.9, top_k 50, seeded
  controls   sampled + presence/frequency/repetition penalties, min_p, logit_bias (50 ids), min_tokens
  json_schema  greedy under a bounded object schema (string, integer, enum, array, nested object)
  json_object  greedy under json_object
Grammar requests end when their JSON does, so their batches shrink; tokens/s counts what ran.
Each cell keeps the best of --repeats runs (the least disturbed on a shared machine); all are in
the JSON. Writes <tag>.csv / .json under --out with CPU name, commit, load and settings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
from pathlib import Path

import torch

from base_sglang.engine import EngineConfig, LLMEngine, SamplingParams
from base_sglang.engine.config import DEFAULT_MODEL_DIR
from base_sglang.protocol import ResponseFormat

SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string", "maxLength": 32},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                  "maxItems": 4},
                         "address": {"type": "object",
                                     "properties": {"city": {"type": "string", "maxLength": 24},
                                                    "zip": {"type": "integer", "minimum": 0,
                                                            "maximum": 99999}},
                                     "required": ["city", "zip"]}},
          "required": ["name", "age", "color", "tags", "address"]}


def settings(max_tokens: int) -> dict[str, dict]:
    sampled = dict(temperature=1.0, top_p=0.9, top_k=50, seed=1)
    return {
        "plain": dict(temperature=0.0, ignore_eos=True),
        "sampled": dict(sampled, ignore_eos=True),
        "controls": dict(sampled, ignore_eos=True, presence_penalty=0.5, frequency_penalty=0.5,
                         repetition_penalty=1.2, min_p=0.05, min_tokens=max_tokens // 2,
                         logit_bias={t: -5.0 for t in range(100, 150)}),
        "json_schema": dict(temperature=0.0,
                            response_format=ResponseFormat.create("json_schema", SCHEMA)),
        "json_object": dict(temperature=0.0, response_format=ResponseFormat.create("json_object")),
    }


class TimedSampler:
    """Wraps the engine's sampler to add up its wall time."""

    def __init__(self, sampler):
        self.sampler, self.seconds = sampler, 0.0

    def __call__(self, logits, seqs):
        t0 = time.perf_counter()
        try:
            return self.sampler(logits, seqs)
        finally:
            self.seconds += time.perf_counter() - t0


def measure(engine: LLMEngine, name: str, kw: dict, batch: int, max_tokens: int) -> dict:
    params = SamplingParams(max_tokens=max_tokens, **kw)
    for i in range(batch):
        engine.add_request(f"Record {i} of the customer table, as JSON:\n", params, "dense")
    timed = engine.sampler = TimedSampler(engine.sampler)
    engine.step()  # the prefill (and the first token)
    timed.seconds = 0.0
    steps, tokens, wall, reasons = 0, 0, 0.0, {}
    while engine.has_unfinished():
        t0 = time.perf_counter()
        outs = engine.step()
        wall += time.perf_counter() - t0
        steps += 1
        tokens += sum(len(o.token_ids) for o in outs)
        for o in outs:
            if o.finished:
                reasons[o.finish_reason] = reasons.get(o.finish_reason, 0) + 1
    engine.sampler = timed.sampler
    return {"setting": name, "batch": batch, "decode_steps": steps, "tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "step_ms": round(wall / steps * 1e3, 3),
            "sampler_ms_per_step": round(timed.seconds / steps * 1e3, 3),
            "finish": json.dumps(reasons, sort_keys=True)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="sampling_cpu")
    args = ap.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, policy="dense", device="cpu",
                                    max_running_requests=max(args.batch),
                                    num_threads=args.num_threads))
    grid = settings(args.max_tokens)
    measure(engine, "plain", grid["plain"], max(args.batch), 8)  # warm-up
    for kw in grid.values():  # compile the grammars outside the timed runs
        engine.compile_grammar(SamplingParams(max_tokens=args.max_tokens, **kw))
    load_before = os.getloadavg()
    cells: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.repeats):
        for name, kw in grid.items():
            for batch in args.batch:
                cells.setdefault((name, batch), []).append(
                    measure(engine, name, kw, batch, args.max_tokens))
    rows = []
    for reps in cells.values():
        r = dict(max(reps, key=lambda x: x["tokens_per_s"]))
        r["tokens_per_s_all"] = [x["tokens_per_s"] for x in reps]
        rows.append(r)
        print(f"{r['setting']:>12} B={r['batch']:>3} {r['tokens_per_s']:8.1f} tok/s "
              f"{r['step_ms']:8.2f} ms/step  sampler {r['sampler_ms_per_step']:6.3f} ms/step  "
              f"finish {r['finish']}  all {r['tokens_per_s_all']}", flush=True)
    from bench_serving import commit, cpu_name  # same folder

    meta = {"cpu": cpu_name(), "cores": os.cpu_count(), "commit": commit(),
            "model": Path(args.model).name, "policy": "dense", "max_tokens": args.max_tokens,
            "repeats": args.repeats, "num_threads": args.num_threads, "torch": torch.__version__,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.tag}.json").write_text(json.dumps({"meta": meta, "schema": SCHEMA,
                                                      "rows": rows}, indent=2))
    with open(out / f"{args.tag}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "tokens_per_s_all"]
                           + ["cpu", "commit", "model"])
        w.writeheader()
        for r in rows:
            w.writerow({**{k: v for k, v in r.items() if k != "tokens_per_s_all"},
                        "cpu": meta["cpu"], "commit": meta["commit"], "model": meta["model"]})
    print(json.dumps(meta))


if __name__ == "__main__":
    main()
