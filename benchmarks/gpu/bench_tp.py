"""BASE inside real SGLang under tensor parallelism (issue 17): rank agreement, throughput, profile.

`--tp 2` starts one process per rank (as sglang.benchmark.one_batch does for --tp-size > 1), each
a bench_decode.Bench on its own GPU (dummy Qwen3-30B-A3B, decode CUDA graphs, plugin on), in
lockstep through SGLang's all-reduces:
  1. agreement: for each --agree-batches size (not a captured size, so graphs run with padded
     rows), prefill, then --agree-steps graph-replayed and --agree-eager-steps eager decode steps
     in which every request gets its own budget, redrawn every step (seeded: the same on every
     rank). BASE_SELECTION_TRACE makes each rank's plugin write a digest of the kept ids and
     weights per MoE layer per step (plugin/selection_trace.py); after a barrier rank 0 compares
     the files: "ranks_agree" and "steps_compared" in summary.json.
  2. throughput: bench_decode.sweep_batch per --batches size over --budgets (trace writes paused:
     no host syncs in the timed steps; the graphs are the same), with the B=16 profile (GPU time
     by category, incl. "allreduce"; byte floors per rank).
`--tp 1` runs the same throughput part in-process on one GPU (summary_tp1.json), for the ratio.
`--finalize` adds the TP=1 comparison to summary.json, validates it and prints the tables.

    python3 benchmarks/gpu/bench_tp.py --tp 2 --out OUT            # summary.json, profile_b16_tp2.json
    CUDA_VISIBLE_DEVICES=0 python3 benchmarks/gpu/bench_tp.py --tp 1 --out OUT   # summary_tp1.json
    python3 benchmarks/gpu/bench_tp.py --finalize --out OUT
    python3 benchmarks/gpu/bench_tp.py --tp 2 --out OUT --dry-run  # files + each rank's argv only

Other flags are bench_decode.py's (defaults here: --batches 16 32 64, --budgets dense 8 10 16);
arguments after `--` go to SGLang's ServerArgs. NVLink multicast stays off: every rank forces
NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 (SGLang's own
subprocesses inherit them), and SGLang's symmetric-memory all-reduce (v2) and FlashInfer's
all-reduce fusion are switched off (its legacy CUDA-IPC custom all-reduce and NCCL remain).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_decode  # noqa: E402
import common  # noqa: E402
from step_profile import byte_floors  # noqa: E402
from summary_schema import validate_tp_summary  # noqa: E402

from base_sglang.plugin.selection_trace import ENV as TRACE_ENV  # noqa: E402
from base_sglang.plugin.selection_trace import compare_traces, trace_path  # noqa: E402

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}
SGLANG_ENV = {"SGLANG_OPT_USE_CUSTOM_ALL_REDUCE_V2": "0"}  # v2 allocates torch symmetric memory
TP_FLAGS = ("--enforce-disable-flashinfer-allreduce-fusion",)  # auto-on for Qwen3-MoE on SM90
MULTICAST_FLAGS = ("--enable-nccl-nvls", "--enable-symm-mem", "--enable-torch-symm-mem",
                   "--enable-mscclpp", "--flashinfer-allreduce-fusion-backend")  # refused
DEFAULTS = ("--batches", "16", "32", "64", "--budgets", "dense", "8", "10", "16",
            "--time-budget", "240")
TP1_SUMMARY, TP_SUMMARY = "summary_tp1.json", "summary.json"
SCRATCH = Path("/tmp/base-bench/tp")  # other ranks' logs and result copies (not in $OUT)


def summary_name(tp: int) -> str:
    return TP1_SUMMARY if tp == 1 else TP_SUMMARY


def profile_name(tp: int) -> str:
    return f"profile_b16_tp{tp}.json"


def trace_prefix(out: Path) -> Path:
    return out / "trace" / "sel"


# ---- arguments ----------------------------------------------------------------------------------
def parse_args(argv=None):
    argv, sgl_extra = common.split_sglang_args(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size (1: one GPU)")
    p.add_argument("--agree-batches", type=int, nargs="*", default=[11, 27, 50],
                   help="batch sizes of the agreement phase (tp > 1); pick non-captured sizes")
    p.add_argument("--agree-steps", type=int, default=100, help="graph decode steps per batch")
    p.add_argument("--agree-eager-steps", type=int, default=4, help="eager decode steps per batch")
    p.add_argument("--agree-budgets", nargs="+", default=["4", "8", "10", "16", "32"],
                   help="per-request budgets drawn in the agreement phase")
    p.add_argument("--agree-dense-rate", type=float, default=0.02,
                   help="chance a request is dense in a step (its batch then keeps the union)")
    p.add_argument("--rank-timeout", type=float, default=400.0,
                   help="seconds before the rank processes are stopped (tp > 1)")
    p.add_argument("--nccl-port", type=int, default=0, help="0: a free port")
    p.add_argument("--finalize", action="store_true",
                   help="merge the TP=1 comparison into OUT/summary.json and print the tables")
    own, rest = p.parse_known_args(argv)
    if own.finalize:
        fin = argparse.ArgumentParser(prog="bench_tp.py --finalize")
        fin.add_argument("--out", required=True)
        own.out = fin.parse_args(rest).out
        return own
    if any(a in ("--report", "--merge") for a in rest):
        p.error("--report/--merge are bench_decode.py's; use --finalize")
    bad = [a for a in sgl_extra if a.split("=")[0] in MULTICAST_FLAGS]
    if bad:
        p.error(f"SGLang arguments {bad}: they can turn NVLink multicast on, which the device "
                "forbids")
    args = bench_decode.parse_args([*DEFAULTS, *rest, *(["--", *sgl_extra] if sgl_extra else [])])
    for key, val in vars(own).items():
        setattr(args, key, val)
    num_e = common.QWEN3_30B_A3B["num_experts"]
    if not 1 <= args.tp <= 8:
        p.error(f"--tp: must be in 1..8, got {args.tp}")
    if args.plugin != "on":
        p.error("--plugin: must be on (the TP check is about BASE's selection)")
    top = max(args.batches)
    if args.tp > 1 and any(not 1 <= b <= top for b in args.agree_batches):
        p.error(f"--agree-batches: each must be in 1..{top} (the largest captured batch, so the "
                f"steps replay graphs), got {args.agree_batches}")
    if args.agree_steps < 0 or args.agree_eager_steps < 0:
        p.error("--agree-steps and --agree-eager-steps: must be >= 0")
    if not 0.0 <= args.agree_dense_rate <= 1.0:
        p.error(f"--agree-dense-rate: must be in [0, 1], got {args.agree_dense_rate}")
    if args.rank_timeout <= 0:
        p.error(f"--rank-timeout: must be > 0, got {args.rank_timeout}")
    if not 0 <= args.nccl_port < 65536:
        p.error(f"--nccl-port: must be a port number, got {args.nccl_port}")
    try:
        budgets = [bench_decode.parse_budget(b, num_e) for b in args.agree_budgets]
    except ValueError as exc:
        p.error(str(exc).replace("--budgets", "--agree-budgets"))
    args.agree_budgets = [num_e if b == "dense" else b for b in budgets]
    return args


def with_tp_args(args, port: int):
    """A copy of args whose SGLang argv (bench_decode.sglang_argv) runs --tp-size args.tp: the
    same on every rank (SGLang tells the ranks apart by the tp_rank it is given)."""
    sub = copy.copy(args)
    sub.sglang_extra = [*args.sglang_extra, "--tp-size", str(args.tp), "--nccl-port", str(port),
                        *(TP_FLAGS if args.tp > 1 else ())]
    return sub


def step_budgets(args, batch: int, step: int, num_experts: int) -> list[int]:
    """Per-request budgets of one agreement step: seeded by (seed, batch, step), so every rank
    draws the same (random.Random with an int seed is the same in every process)."""
    rng = random.Random(args.seed * 1_000_003 + batch * 1009 + step)
    return [num_experts if rng.random() < args.agree_dense_rate else rng.choice(args.agree_budgets)
            for _ in range(batch)]


def set_request_budgets(reqs, budgets: list[int]) -> None:
    """Each request's budget for the next decode step, where the plugin reads it (custom_params,
    as the tokenizer hook leaves it). one_batch's synthetic requests share one SamplingParams
    object: each gets its own copy first."""
    if len({id(r.sampling_params) for r in reqs}) < len(reqs):
        for r in reqs:
            r.sampling_params = copy.copy(r.sampling_params)
    for r, b in zip(reqs, budgets, strict=True):
        r.sampling_params.custom_params = {"expert_budget": b}


def _force_env() -> None:
    os.environ.update(NO_MULTICAST)
    os.environ.update(SGLANG_ENV)


# ---- one rank -----------------------------------------------------------------------------------
def rank_main(rank: int, args, port: int) -> int:
    import torch

    _force_env()
    torch.cuda.set_device(rank)  # before SGLang's NCCL setup (its ModelRunner does it too)
    out = Path(args.out)
    here = out if rank == 0 else SCRATCH / f"rank{rank}"
    here.mkdir(parents=True, exist_ok=True)
    clock = common.Clock()
    config = bench_decode.prepare_files(args)
    bench_decode.set_plugin_env(args)
    agree = args.tp > 1 and args.agree_batches and args.agree_steps + args.agree_eager_steps > 0
    if agree:
        os.environ[TRACE_ENV] = str(trace_prefix(out))
    else:
        os.environ.pop(TRACE_ENV, None)
    sub = with_tp_args(args, port)
    bench = bench_decode.Bench(sub, config, clock, gpu_id=rank, tp_rank=rank)
    import sglang

    info = common.run_info()
    info["sglang_version"] = info["sglang_version"] or getattr(sglang, "__version__", "unknown")
    info.update(tp=args.tp, rank=rank, env={k: os.environ.get(k) for k in (*NO_MULTICAST,
                                                                            *SGLANG_ENV)})
    summary = here / summary_name(args.tp)
    common.update_json(summary, lambda o: o.update(
        {"tp": args.tp, **({"ranks_agree": False, "steps_compared": 0,
                            "agreement": {"status": "not run"}} if args.tp > 1 else {})}))
    if agree:
        res = agreement_phase(bench, args, rank, config)
        if rank == 0:
            _record_agreement(summary, res)
    sweep(bench, args, rank, config, clock, info, summary, here / profile_name(args.tp), sub)
    return 0


def agreement_phase(bench, args, rank, config) -> dict | None:
    """Mixed per-request budgets through graph and eager decode steps, traced on every rank."""
    import numpy as np

    st = bench.state.STATE
    if st.sel_trace is None:
        raise SystemExit(f"[tp] {TRACE_ENV} is set but the plugin holds no selection trace")
    st.sel_trace.writing = True
    t0 = time.perf_counter()
    for B in args.agree_batches:
        bench.runner.clear()
        np.random.seed(args.seed + 7 * B)
        reqs = bench.ob.prepare_synthetic_inputs_for_latency_test(B, args.input_len)
        next_ids, _, batch = bench.runner.extend(reqs)
        for step in range(args.agree_steps + args.agree_eager_steps):
            set_request_budgets(reqs, step_budgets(args, B, step, st.num_experts))
            if step < args.agree_steps:
                next_ids = bench.decode(next_ids, batch)
            else:
                with bench.eager():
                    next_ids = bench.decode(next_ids, batch)
        print(f"[tp] rank {rank}: agreement B={B}: {args.agree_steps} graph + "
              f"{args.agree_eager_steps} eager steps", flush=True)
    bench.sync()
    st.sel_trace.writing = False
    _any_rank(False)  # a barrier: every rank's trace file is complete past this point
    elapsed = time.perf_counter() - t0
    if rank != 0:
        return None
    res = compare_traces([trace_path(str(trace_prefix(Path(args.out))), r)
                          for r in range(args.tp)])
    res.update(seconds=round(elapsed, 2), batches=args.agree_batches,
               graph_steps_per_batch=args.agree_steps, eager_steps_per_batch=args.agree_eager_steps,
               budgets=args.agree_budgets, dense_rate=args.agree_dense_rate,
               captured_batches=args.batches)
    print(f"[tp] ranks agree: {res['ranks_agree']} over {res['steps_compared']} decode steps x "
          f"{res['layers']} MoE layers ({res['modes']}); mismatched steps "
          f"{res['mismatched_steps']}; problems {res['problems']}", flush=True)
    return res


def _record_agreement(summary: Path, res: dict) -> None:
    common.update_json(summary, lambda o: o.update(
        ranks_agree=bool(res["ranks_agree"]), steps_compared=int(res["steps_compared"]),
        agreement=res))


def _any_rank(flag: bool) -> bool:
    """True on every rank if it is True on any (a collective: all ranks must call it together)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def sweep(bench, args, rank, config, clock, info, summary, profile_path, sub) -> None:
    """bench_decode's throughput sweep, with every skip decided jointly (ranks stay in lockstep)."""
    settings = {"sglang_argv": bench_decode.sglang_argv(sub), "input_len": args.input_len,
                "rounds": args.rounds, "steps_per_round": args.steps,
                "warmup_per_round": args.warmup, "timed_steps_per_row": args.rounds * args.steps,
                "batches": args.batches, "budgets": args.budgets, "seed": args.seed,
                "model_config": config, "predictor": str(args.predictor), "tp": args.tp,
                "select_fn": bench_decode._select_name(bench), "run_info": info,
                "note": "decode_tok_s: tokens of the whole batch per second (all ranks together)"}
    timings = {"load_and_capture_s": round(bench.load_s, 2),
               "graph_capture_s": round(bench.capture_s or 0.0, 2), "per_batch_s": {}}
    rows, stats, profiles, truncated = [], [], {}, []
    total = args.rounds * len(args.budgets) * (args.warmup + args.steps) + 64
    for B in args.batches:
        late = _any_rank(clock.elapsed() > args.time_budget)
        no_fit = _any_rank(B > bench.runner.max_batch_size(args.input_len, total))
        if late or no_fit:
            truncated.append(B)
            print(f"[tp] rank {rank}: skipping B={B} ({'time budget' if late else 'KV pool'})",
                  flush=True)
            continue
        t0 = time.perf_counter()
        b_rows, b_stats, prof = bench_decode.sweep_batch(bench, B, args, config)
        rows, stats = rows + b_rows, stats + b_stats
        for p in (prof or {}).values():
            _tp_floors(p, config, args.tp)
        profiles.update(prof or {})
        timings["per_batch_s"][str(B)] = round(time.perf_counter() - t0, 2)
        bench_decode.write_results(summary, profile_path, info, args, "plugin_on", rows, stats,
                                   settings, timings, profiles, truncated)
        bench_decode.print_rows(b_rows, b_stats)
    timings["total_s"] = round(clock.elapsed(), 2)
    bench_decode.write_results(summary, profile_path, info, args, "plugin_on", rows, stats,
                               settings, timings, profiles, truncated)
    print(f"[tp] rank {rank}: wrote {summary} ({len(rows)} rows, {timings['total_s']:.0f} s)",
          flush=True)


def _tp_floors(p: dict, config: dict, tp: int) -> None:
    """Replace a profile's byte floors by one rank's (bench_decode computes them for one GPU)."""
    f = p.get("byte_floor")
    if f:
        p["byte_floor"] = byte_floors(config, p["batch"], f["context_len"], f["experts_per_layer"],
                                      f["union_dense"], tp=tp)


# ---- the parent (tp > 1) --------------------------------------------------------------------------
def _rank_entry(rank: int, args, port: int) -> None:
    if rank > 0:  # one log per extra rank (rank 0's output is the run's)
        SCRATCH.mkdir(parents=True, exist_ok=True)
        fd = os.open(SCRATCH / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    _hard_exit(rank_main(rank, args, port))


def _hard_exit(rc: int) -> None:
    """Exit without the interpreter's teardown once the results are written: NCCL's and SGLang's
    background threads can abort a finished process there, which would turn a good run's exit
    status into a failure."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def run_ranks(args, port: int) -> int:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_entry, args=(r, args, port), name=f"tp-rank{r}")
             for r in range(args.tp)]
    for p in procs:
        p.start()
    stop = {"why": None}

    def on_term(signum, _frame):
        stop["why"] = f"signal {signum}"

    signal.signal(signal.SIGTERM, on_term)
    deadline = time.monotonic() + args.rank_timeout
    while any(p.is_alive() for p in procs):
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        if failed or time.monotonic() > deadline or stop["why"]:
            why = stop["why"] or (f"{failed[0].name} exited with {failed[0].exitcode}" if failed
                                  else f"--rank-timeout {args.rank_timeout:.0f} s passed")
            print(f"[tp] stopping the ranks: {why}", flush=True)
            _stop(procs)
            break
        time.sleep(0.5)
    codes = [p.exitcode for p in procs]
    print(f"[tp] rank exit codes: {codes}", flush=True)
    _collect(args)
    if any(c != 0 for c in codes):
        for r in range(1, args.tp):
            log_file = SCRATCH / f"rank{r}.log"
            if log_file.is_file():
                tail = log_file.read_text(errors="replace").splitlines()[-40:]
                print(f"[tp] --- last lines of rank {r}'s log ---\n" + "\n".join(tail), flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    t = time.monotonic() + 8  # within run_tp2_h200.sh's `timeout -k 15`
    for p in procs:
        p.join(timeout=max(0.1, t - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)


def _collect(args) -> None:
    """After the ranks: the authoritative comparison of the trace files (also when rank 0 died
    after the agreement phase) and the other ranks' profile tables in rank 0's profile file."""
    out = Path(args.out)
    paths = [trace_path(str(trace_prefix(out)), r) for r in range(args.tp)]
    summary = out / summary_name(args.tp)
    if all(p.is_file() for p in paths) and summary.is_file():
        try:
            res = compare_traces(paths)
        except ValueError as exc:  # e.g. a rank stopped in the middle of a line
            res = {"ranks_agree": False, "steps_compared": 0, "problems": [str(exc)]}
        old = json.loads(summary.read_text()).get("agreement", {})
        res.update({k: v for k, v in old.items() if k not in res})
        _record_agreement(summary, res)
    elif summary.is_file():
        common.update_json(summary, lambda o: o.setdefault("agreement", {}).update(
            status="trace files missing", files=[str(p) for p in paths]))
    prof = out / profile_name(args.tp)
    others = {}
    for r in range(1, args.tp):
        f = SCRATCH / f"rank{r}" / profile_name(args.tp)
        if f.is_file():
            obj = json.loads(f.read_text())
            others[f"rank{r}"] = {k: {kk: v.get(kk) for kk in ("graph_step_ms", "eager_step_ms",
                                                              "byte_floor")} |
                                  {"gpu_ms_per_step": v.get("graph_kernels", {})
                                   .get("gpu_ms_per_step")}
                                  for k, v in obj.items() if not k.startswith("_")}
    if others and prof.is_file():
        common.update_json(prof, lambda o: o.update(_other_ranks=others))


# ---- finalize: the comparison with one GPU, the tables ----------------------------------------------
def finalize(out: Path) -> int:
    path = out / TP_SUMMARY
    if not path.is_file():
        print(f"[tp] no {path}: the TP run wrote nothing")
        return 1
    obj = json.loads(path.read_text())
    tp1_path = out / TP1_SUMMARY
    tp1 = json.loads(tp1_path.read_text()) if tp1_path.is_file() else {}
    obj["single_gpu"] = {"file": TP1_SUMMARY if tp1 else None,
                         "comparison": comparison(obj.get("rows", []), tp1.get("rows", []))}
    try:
        validate_tp_summary(obj)
        obj.pop("schema_error", None)
    except ValueError as exc:
        obj["schema_error"] = str(exc)
    common.write_json(path, obj)
    print(report(obj, tp1, _load(out / profile_name(obj.get("tp", 2))),
                 _load(out / profile_name(1))))
    ok = obj.get("ranks_agree") is True and bool(obj.get("rows")) and "schema_error" not in obj
    return 0 if ok else 1


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def comparison(tp_rows: list[dict], tp1_rows: list[dict]) -> list[dict]:
    """Per (batch, budget): tok/s under TP and on one GPU, their ratio, each one's x dense."""
    one = {(r["batch"], r["budget"]): r["decode_tok_s"] for r in tp1_rows}
    tpd = {(r["batch"], r["budget"]): r["decode_tok_s"] for r in tp_rows}
    out = []
    for r in tp_rows:
        key, v = (r["batch"], r["budget"]), r["decode_tok_s"]
        d, v1 = tpd.get((r["batch"], "dense")), one.get(key)
        d1 = one.get((r["batch"], "dense"))
        out.append({"batch": r["batch"], "budget": r["budget"], "tp_tok_s": v, "tp1_tok_s": v1,
                    "tp_over_tp1": round(v / v1, 3) if v1 else None,
                    "tp_x_dense": round(v / d, 3) if d else None,
                    "tp1_x_dense": round(v1 / d1, 3) if v1 and d1 else None,
                    "experts_per_layer": r["experts_per_layer"], "union_dense": r["union_dense"]})
    return out


def report(obj: dict, tp1: dict, prof_tp: dict, prof_tp1: dict) -> str:
    tp = obj.get("tp", "?")
    lines = [f"\n== BASE under TP={tp} ({obj.get('gpu')}, sglang {obj.get('sglang_version')}, "
             f"commit {obj.get('commit')}) vs one GPU =="]
    table = [[c["batch"], c["budget"], c["tp_tok_s"], c["tp1_tok_s"], c["tp_over_tp1"],
              c["tp_x_dense"], c["tp1_x_dense"], c["experts_per_layer"], c["union_dense"]]
             for c in obj.get("single_gpu", {}).get("comparison", [])]
    lines.append(common.format_table(["B", "budget", f"TP{tp} tok/s", "TP1 tok/s", "TP/TP1",
                                      f"TP{tp} x dense", "TP1 x dense", "experts/layer", "union"],
                                     table))
    ag = obj.get("agreement", {})
    lines.append(f"ranks agree: {obj.get('ranks_agree')} over {obj.get('steps_compared')} decode "
                 f"steps x {ag.get('layers')} MoE layers (modes {ag.get('modes')}, mismatched "
                 f"steps {ag.get('mismatched_steps')}, first {ag.get('first_mismatch')}, problems "
                 f"{ag.get('problems')})")
    lines.append(profile_table(prof_tp, prof_tp1, tp))
    if obj.get("schema_error"):
        lines.append(f"schema error: {obj['schema_error']}")
    return "\n".join(lines)


SPLIT = (("MoE experts", ("moe_experts",)), ("attention", ("attention",)),
         ("BASE selection", ("base_select",)), ("all-reduce", ("allreduce",)),
         ("dense GEMMs", ("gemm",)), ("router + norm + other", ("router", "norm", "other")))


def profile_split(p: dict) -> dict | None:
    """One profile entry -> ms per step by the SPLIT groups, GPU busy, graph step, MoE share."""
    cats = (p.get("graph_kernels") or {}).get("gpu_ms_per_step")
    if not cats:
        return None
    split = {name: round(sum(cats.get(c, 0.0) for c in keys), 3) for name, keys in SPLIT}
    busy = sum(cats.values())
    split.update({"GPU busy": round(busy, 3), "graph step": p.get("graph_step_ms"),
                  "MoE share": round(split["MoE experts"] / busy, 3) if busy else None,
                  "byte floor": (p.get("byte_floor") or {}).get("total_floor_ms")})
    return split


def _budget_order(key: str):
    b = key.split("/")[-1]
    return (0, 0) if b in ("dense", "off") else (1, -int(b)) if b.isdigit() else (2, 0)


def profile_table(prof_tp: dict, prof_tp1: dict, tp) -> str:
    cols = []
    for name, prof in ((f"TP{tp}", prof_tp), ("TP1", prof_tp1)):
        for key in sorted((k for k in prof if not k.startswith("_")), key=_budget_order):
            s = profile_split(prof[key])
            if s:
                cols.append((f"{name} {key.split('/')[-1]}", s))
    if not cols:
        return "profile: none recorded"
    names = [n for n, _ in SPLIT] + ["GPU busy", "graph step", "MoE share", "byte floor"]
    rows = [[n, *[c[1].get(n) for c in cols]] for n in names]
    return ("ms per decode step at the profiled batch (rank 0; graph replays):\n"
            + common.format_table(["", *[c[0] for c in cols]], rows))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.finalize:
        return finalize(Path(args.out))
    _force_env()
    bench_decode.prepare_files(args)
    port = args.nccl_port or _free_port()
    if args.dry_run:
        argv = " ".join(bench_decode.sglang_argv(with_tp_args(args, port)))
        for r in range(args.tp):
            print(f"rank {r} (gpu {r}, tp_rank {r}): {argv}")
        if args.tp > 1:
            print(f"agreement: batches {args.agree_batches}, {args.agree_steps} graph + "
                  f"{args.agree_eager_steps} eager steps each, budgets {args.agree_budgets}, "
                  f"trace {trace_prefix(Path(args.out))}.rank<R>.jsonl")
        return 0
    problem = _gpu_problem(args.tp)
    if problem:
        print(f"[tp] {problem}", flush=True)
        return 2
    if args.tp == 1:
        _hard_exit(rank_main(0, args, port))
    return run_ranks(args, port)


def _gpu_problem(tp: int) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return f"--tp {tp}: no CUDA device here (this benchmark runs on GPUs: see --dry-run)"
    if torch.cuda.device_count() < tp:
        return f"--tp {tp}: needs {tp} GPUs, {torch.cuda.device_count()} visible"
    return None


if __name__ == "__main__":
    sys.exit(main())
