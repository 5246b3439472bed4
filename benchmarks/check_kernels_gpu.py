"""GPU-only correctness checks for base_sglang.kernels at real shapes (run through the device tool).

    python benchmarks/check_kernels_gpu.py [--out DIR] [--quick]
Every kernel output is allocated poisoned (NaN / 77, kernel_common.poisoned_outputs) for the eager
checks, so an element a kernel fails to write cannot pass.
1. selection: base_select_experts (one launch) == core select_experts (policy base): ids exact,
   weights |diff| <= 1e-5, union/kept counts exact, removed cost to 1e-5; Qwen3/OLMoE/Mixtral shapes,
   T in {1, 16, 64}, budgets uniform / M < K / mixed / padded / padded with -1 ids / one dense row;
   int32 ids (int64 once per shape); renorm native/never x backfill on/off at T=16.
2. CUDA graph: selection + fused MoE captured once, replayed with changed budgets (M=8, 16, mixed
   with padded rows, dense, all padded) == eager, bitwise (Qwen3 T=16 and OLMoE T=64).
3. two streams: selections interleaved on two streams (separate ticket counters) == eager.
4. dropped experts' weights set to NaN: the fused MoE output is finite and matches the reference.
5. fused_moe vs an fp32 reference at the three shapes, T in {1, 16, 64} (2-launch decode path) and
   T=128 (4-launch blocked path); run-to-run bitwise equal; at T=16 also int32 == int64 ids,
   decode == blocked, and the decode path without loop flattening vs the reference.
Prints one PASS/FAIL line per check and exits 1 on any failure; writes checks.json to --out after
every section. --shapes runs a subset (the device script runs one process per shape in parallel:
checks time no kernel), --merge joins their checks.json files into one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_common import DEVICE, SHAPES, make_experts, make_routing, poisoned_outputs  # noqa: E402

from base_sglang.core import (  # noqa: E402
    Predictor,
    PredictorMeta,
    SelectionConfig,
    moe_forward_ref,
    select_experts,
)
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import DecodeConfig, MoeConfig  # noqa: E402

RESULTS: list[dict] = []
TOKENS = (1, 16, 64) if DEVICE == "cuda" else (1, 16)
MOE_TOKENS = (1, 16, 64, 128) if DEVICE == "cuda" else (1, 16, 70)
REL_TOL = 1e-2


def record(name: str, ok: bool, **info) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), **info})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(info, default=str)}", flush=True)


def make_predictor(E: int, H: int, seed: int = 0) -> Predictor:
    g = torch.Generator().manual_seed(seed)
    meta = PredictorMeta(architecture="synthetic", model_id="synthetic", num_layers=1,
                         moe_layers=[0], hidden_size=H, num_experts=E, top_k=0)
    return Predictor(meta=meta, weight=torch.randn(1, E, H, generator=g) * 0.02,
                     bias=torch.randn(1, E, generator=g) * 0.1).to(DEVICE)


def budgets(T: int, E: int, K: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    mixed = torch.randint(max(K // 2, 1), E, (T,), generator=g)
    padded = mixed.clone()
    padded[::3] = -1
    out = {"uniform_M10": torch.full((T,), min(10, E - 1)), "M_lt_K": torch.full((T,), max(K // 2, 1)),
           "mixed": mixed, "padded": padded, "dense_row": torch.where(torch.arange(T) == 0, E, 3)}
    return {k: v.to(DEVICE) for k, v in out.items()}


def same_selection(ref, got) -> bool:
    return (torch.equal(ref.ids, got.ids) and ref.ids.dtype == got.ids.dtype
            and (ref.weights - got.weights).abs().max().item() <= 1e-5
            and int(ref.stats.num_union) == int(got.stats.num_union)
            and int(ref.stats.num_kept) == int(got.stats.num_kept)
            and abs(float(ref.stats.removed_cost) - float(got.stats.removed_cost))
            <= 1e-5 * max(1.0, abs(float(ref.stats.removed_cost))))


def check_selection() -> None:
    for shape, s in SHAPES.items():
        E, K, H = s["E"], s["K"], s["H"]
        pred = make_predictor(E, H)
        norm = s["norm_topk_prob"]
        for T in TOKENS:
            r = make_routing(T, E, K, norm, seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            cases = [(b, bud, torch.int32, "native", True) for b, bud in budgets(T, E, K).items()]
            cases.append(("uniform_M10", budgets(T, E, K)["uniform_M10"], torch.int64, "native", True))
            if T == 16:
                bud = budgets(T, E, K)["mixed"]
                cases += [("mixed", bud, torch.int32, rn, bf)
                          for rn, bf in (("never", True), ("native", False), ("never", False))]
            bad = []
            for bname, bud, dt, renorm, backfill in cases:
                cfg = SelectionConfig(policy="base", renorm=renorm, backfill=backfill)
                ids = r.ids.to(dt)
                if bname == "padded":  # SGLang marks DP padding rows with -1 ids
                    ids = torch.where((bud < 0)[:, None], torch.full_like(ids, -1), ids)
                    ref = select_experts(r.logits, r.ids.to(dt), r.weights, hidden, bud, 0, cfg,
                                         pred, norm_topk_prob=norm)
                else:
                    ref = select_experts(r.logits, ids, r.weights, hidden, bud, 0, cfg, pred,
                                         norm_topk_prob=norm)
                with poisoned_outputs():
                    got = base_select_experts(r.logits, ids, r.weights, hidden, bud, 0, cfg, pred,
                                              norm_topk_prob=norm)
                if not same_selection(ref, got):
                    bad.append((bname, str(dt), renorm, backfill,
                                int((ref.ids != got.ids).any(1).sum())))
            record(f"selection/{shape}/T={T}", not bad, cases=len(cases), failures=bad[:4])


def capture(step):
    """Eager warm-up on the capture stream, then a graph of one step(); returns (graph, outputs)."""
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        step()
    torch.cuda.current_stream().wait_stream(s_)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s_):
        static = step()
    return g, static


def check_graph() -> None:
    for shape, T in (("qwen3-30b-a3b", 16), ("olmoe-1b-7b", 64)):
        if shape in SHAPES:
            graph_case(shape, T)


def graph_case(shape: str, T: int) -> None:
    s = SHAPES[shape]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    pred = make_predictor(E, H)
    gate_up, down = make_experts(E, H, I, seed=1)
    r = make_routing(T, E, K, s["norm_topk_prob"], seed=3)
    hidden = torch.randn(T, H, device=DEVICE).bfloat16()
    cfg = SelectionConfig(policy="base")
    budget = torch.full((T,), 10, dtype=torch.int64, device=DEVICE)  # static buffer

    def step():
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden, budget, 0, cfg, pred,
                                  norm_topk_prob=s["norm_topk_prob"])
        return sel.ids, sel.weights, fused_moe(hidden, sel.ids, sel.weights, gate_up, down)

    pattern = torch.tensor([-1, 4, 12, 30])
    trials = {"M8": torch.full((T,), 8), "M16": torch.full((T,), 16),
              "mixed_padded": pattern.repeat(T // 4 + 1)[:T], "dense": torch.full((T,), E),
              "all_padded": torch.full((T,), -1)}
    eager = {}
    for name, b in trials.items():
        budget.copy_(b)
        eager[name] = [x.clone() for x in step()]
    budget.fill_(10)
    g, static = capture(step)
    for name, b in trials.items():
        budget.copy_(b)
        g.replay()
        torch.cuda.synchronize()
        same = all(torch.equal(a, e) for a, e in zip(static, eager[name]))
        nk = int(torch.unique(static[0][static[0] >= 0]).numel())
        record(f"graph_replay/{shape}/T={T}/{name}", same, experts_kept=nk)


def check_two_streams() -> None:
    if "qwen3-30b-a3b" not in SHAPES:
        return
    s = SHAPES["qwen3-30b-a3b"]
    E, K, H = s["E"], s["K"], s["H"]
    pred = make_predictor(E, H, seed=4)
    cfg = SelectionConfig(policy="base")
    inputs = []
    for i in range(2):
        r = make_routing(16, E, K, True, seed=20 + i)
        hidden = torch.randn(16, H, device=DEVICE).bfloat16()
        bud = torch.full((16,), 8 + 8 * i, device=DEVICE)
        inputs.append((r.logits, r.ids, r.weights, hidden, bud))
    want = [select_experts(*x, 0, cfg, pred) for x in inputs]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for st in streams:
        st.wait_stream(torch.cuda.current_stream())
    outs = [[], []]
    for _ in range(20):
        for i, st in enumerate(streams):
            with torch.cuda.stream(st):
                outs[i].append(base_select_experts(*inputs[i], 0, cfg, pred))
    torch.cuda.synchronize()
    ok = all(same_selection(want[i], o) for i in range(2) for o in outs[i])
    record("selection/two_streams", ok, calls=40)


def check_nan_dropped() -> None:
    for shape, s in SHAPES.items():
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        T = 16
        pred = make_predictor(E, H)
        gate_up, down = make_experts(E, H, I, seed=2)
        r = make_routing(T, E, K, s["norm_topk_prob"], seed=5)
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        M = min(10, E // 2)
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                  torch.full((T,), M, device=DEVICE), 0,
                                  SelectionConfig(policy="base"), pred,
                                  norm_topk_prob=s["norm_topk_prob"])
        kept = torch.zeros(E, dtype=torch.bool, device=DEVICE)
        kept[sel.ids[sel.ids >= 0].long()] = True
        ref = moe_forward_ref(hidden.float(), sel.ids.long(), sel.weights.float(),
                              gate_up.float(), down.float())
        gate_up[~kept] = float("nan")
        down[~kept] = float("nan")
        with poisoned_outputs():
            y = fused_moe(hidden, sel.ids, sel.weights, gate_up, down).float()
        rel = ((y - ref).norm() / ref.norm()).item()
        record(f"nan_dropped/{shape}", bool(torch.isfinite(y).all()) and rel < REL_TOL,
               kept=int(kept.sum()), rel_err_vs_fp32=rel)
        del gate_up, down


def check_fused_moe() -> None:
    for shape, s in SHAPES.items():
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        gate_up, down = make_experts(E, H, I, seed=4)
        for T in MOE_TOKENS:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            ids = r.ids.clone()
            ids[0, -1] = -1  # one dropped slot
            with poisoned_outputs():
                y1 = fused_moe(hidden, ids, r.weights, gate_up, down)
                y2 = fused_moe(hidden, ids, r.weights, gate_up, down)
            ref = moe_forward_ref(hidden.float(), ids.long(), r.weights, gate_up.float(),
                                  down.float())
            rel = ((y1.float() - ref).norm() / ref.norm()).item()
            info = dict(rel_err_vs_fp32=rel, deterministic=torch.equal(y1, y2),
                        path="decode" if T <= 64 else "blocked")
            ok = rel < REL_TOL and torch.equal(y1, y2)
            if T == 16:
                y64 = fused_moe(hidden, ids.long(), r.weights, gate_up, down)
                yb = fused_moe(hidden, ids, r.weights, gate_up, down, config=MoeConfig(decode=None))
                with poisoned_outputs():
                    yn = fused_moe(hidden, ids, r.weights, gate_up, down,
                                   config=MoeConfig(decode=DecodeConfig(flatten=False)))
                info.update(int64_ids_equal=torch.equal(y1, y64),
                            decode_vs_blocked=((y1.float() - yb.float()).norm() / ref.norm()).item(),
                            unflattened_vs_fp32=((yn.float() - ref).norm() / ref.norm()).item())
                ok = (ok and torch.equal(y1, y64) and info["decode_vs_blocked"] < REL_TOL
                      and info["unflattened_vs_fp32"] < REL_TOL)
            record(f"fused_moe/{shape}/T={T}", ok, **info)
        del gate_up, down


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--quick", action="store_true", help="Qwen3 shape only")
    ap.add_argument("--shapes", default="", help="comma-separated subset (parallel shards)")
    ap.add_argument("--merge", nargs="*", default=None,
                    help="only merge the checks.json of these folders into --out")
    args = ap.parse_args()
    if args.merge is not None:
        for d in args.merge:
            path = os.path.join(d, "checks.json")
            if os.path.exists(path):
                RESULTS.extend(json.load(open(path))["checks"])
            else:
                record(f"shard {d}", False, error="no checks.json (killed or crashed)")
        write(args.out)
        failed = [r["check"] for r in RESULTS if not r["ok"]]
        print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed; failed: {failed}")
        return 1 if failed else 0
    global SHAPES
    if args.quick:
        SHAPES = {"qwen3-30b-a3b": SHAPES["qwen3-30b-a3b"]}
    if args.shapes:
        SHAPES = {k: SHAPES[k] for k in args.shapes.split(",")}
    torch.manual_seed(0)
    checks = [check_selection, check_graph, check_two_streams, check_nan_dropped, check_fused_moe]
    if DEVICE != "cuda":  # CPU dry run: no graphs or streams
        checks = [c for c in checks if c not in (check_graph, check_two_streams)]
    t0 = time.time()
    for fn in checks:
        try:
            fn()
        except Exception as e:  # keep going: report every section
            traceback.print_exc()
            record(fn.__name__, False, error=repr(e))
        print(f"[{fn.__name__} done at {time.time() - t0:.0f} s]", flush=True)
        write(args.out)
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed; failed: {failed}")
    return 1 if failed else 0


def write(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "checks.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
                   "commit": os.environ.get("BASE_COMMIT", "unknown"), "checks": RESULTS}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
