"""GPU-only correctness checks for base_sglang.kernels at real shapes (run through the device tool).

    python benchmarks/check_kernels_gpu.py [--out DIR]
1. base_select_experts == core select_experts (policy base): ids exact, weights |diff| <= 1e-5,
   stats; Qwen3/OLMoE/Mixtral shapes, T in {1, 16, 64, 128}, uniform/mixed/padded/dense budgets,
   M < K, int32 and int64 ids, renorm native/never, backfill on/off.
2. CUDA graph: selection + fused MoE captured once, replayed with changed budgets == eager (bitwise).
3. Dropped experts' weights set to NaN: fused MoE output finite and equal to the reference.
4. fused_moe vs an fp32 reference (dense routing) at the three shapes; run-to-run bitwise equal.
5. base_plus (the default policy: partial combine, alpha 0 / 0.5 / 1) and base with renorm=partial:
   kernel == core at Qwen3-30B-A3B's shape (E=128 K=8 H=2048, T in {1, 16, 64}), every budget kind
   above, int32/int64 ids, norm_topk_prob true/false, backfill on/off; prints the max |weight diff|
   and the rows whose ids differ; a CUDA-graph replay of base_plus with changed budgets == eager.
6. Selection latency (graph replay, median) of base vs base_plus at that shape, M=16: equal within
   noise (the check fails only beyond 1.2x); writes base_plus_latency.csv/.json to --out.
7. The one-launch selection's grid barrier (base_fused_select): 300 calls alternating grid sizes
   (T in 1..200, E = 64 / 128) == the core and bitwise equal to the first call of each case; two
   streams launching concurrently; the plain (non-cooperative) launch == the cooperative one.
8. fused_moe grouped, pair-major and the shipped default (tuned rows) == the fp32 reference at the three shapes, T in {1, 2, 16, 64},
   with a dropped slot and an all-dropped token (output exactly 0); run-to-run bit-equal; the tuned
   "budget" rows at M = 8, 16 experts (T = 4, 8, 16) == the reference and bit-equal with idle_low flipped.
9. Selection + fused_moe (T=1 pair-major, T=16 grouped) in one CUDA graph, replays with new budgets
   == eager; 40 launches on two concurrent streams == one eager.
10. base_sched (per-layer tables of two batch-size ranges, non-monotone) in both selection kernels
   == the core, T 1/16/64.
11. The folded router (base_route_select: softmax top-k + BASE in one launch from one GEMM's
   [T, 2E] output) == core.routing.route_select at the three shapes, T in {1, 16, 64}, every
   budget kind above, base and base_plus, backfill on/off, int32 ids; 50 repeated calls bitwise
   equal; a CUDA graph of GEMM + route-select replayed with changed budgets == eager; the tile
   variants the sweep times (check_route_tiles) == the core.
Prints one PASS/FAIL line per check and exits 1 on any failure; writes checks.json to --out.
    --only base_plus   sections 5 and 6 alone (~1 min on the H200, no model weights)
    --only fused       sections 1, 2, 5 and 7 (the selection kernel); --only barrier: 7 alone
    --only moe         sections 8, 9 and 10
    --only route       sections 11 and 10
    --only compact     the narrow backfill against the same tiles with it off, bitwise
    --only sched       section 10 alone
    --only split       the two-launch route-select (base_route_split) == the core, its tilings,
                       == the one launch bitwise at the same tiling, repeat calls, a graph replay
    --shapes a,b       restrict every section to these shapes (default: all three)
    --moe-paths a,b    sections 8 and 9 for these launch structures only (MOE_PATHS, default)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_common import (  # noqa: E402
    DEVICE,
    SHAPES,
    graph_time_us,
    make_experts,
    make_routing,
    provenance,
    write_rows,
)

ALL_SHAPES = dict(SHAPES)  # --shapes narrows SHAPES (the loops); the fixed-shape checks use this

from base_sglang.core import (  # noqa: E402
    Predictor,
    SelectionConfig,
    moe_forward_ref,
    select_experts,
)
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import default_config  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

RESULTS: list[dict] = []
TOKENS = (1, 16, 128) if DEVICE == "cuda" else (1, 5)


def record(name: str, ok: bool, **info) -> None:
    RESULTS.append({"check": name, "ok": bool(ok), **info})
    print(f"{'PASS' if ok else 'FAIL'} {name} {json.dumps(info, default=str)}", flush=True)


def make_predictor(E: int, H: int, seed: int = 0) -> Predictor:
    return random_predictor(E, H, 0, seed=seed, scale=0.02, bias_scale=0.1,
                            architecture="synthetic").to(DEVICE)


def budgets(T: int, E: int, K: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(T)
    mixed = torch.randint(max(K // 2, 1), E, (T,), generator=g)
    padded = mixed.clone()
    padded[::3] = -1
    out = {"uniform_M10": torch.full((T,), min(10, E - 1)), "M_lt_K": torch.full((T,), max(K // 2, 1)),
           "mixed": mixed, "padded": padded, "dense_row": torch.where(torch.arange(T) == 0, E, 3)}
    return {k: v.to(DEVICE) for k, v in out.items()}


def check_selection() -> None:
    for shape, s in SHAPES.items():
        E, K, H = s["E"], s["K"], s["H"]
        pred = make_predictor(E, H)
        for T in TOKENS:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            bad = []
            for bname, bud in budgets(T, E, K).items():
                for dt in (torch.int32, torch.int64):
                    for renorm in ("native", "never"):
                        for backfill in (True, False):
                            cfg = SelectionConfig(policy="base", renorm=renorm, backfill=backfill)
                            args = (r.logits, r.ids.to(dt), r.weights, hidden, bud, 0, cfg, pred)
                            ref = select_experts(*args, norm_topk_prob=s["norm_topk_prob"])
                            got = base_select_experts(*args, norm_topk_prob=s["norm_topk_prob"])
                            ok = (torch.equal(ref.ids, got.ids) and ref.ids.dtype == got.ids.dtype
                                  and (ref.weights - got.weights).abs().max().item() <= 1e-5
                                  and int(ref.stats.num_union) == int(got.stats.num_union)
                                  and int(ref.stats.num_kept) == int(got.stats.num_kept))
                            if not ok:
                                bad.append((bname, str(dt), renorm, backfill,
                                            int((ref.ids != got.ids).any(1).sum())))
            record(f"selection/{shape}/T={T}", not bad, cases=5 * 8, failures=bad[:4])


def graph_replays(step, budget, trials):
    """Run step() eagerly for each budget set, capture it once in a CUDA graph (budget is its static
    buffer), replay it per set; yields (name, replay == eager bit for bit, the replay's outputs)."""
    eager = {}
    for name, b in trials.items():
        budget.copy_(b)
        eager[name] = [x.clone() for x in step()]
    budget.fill_(10)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the capture (allocations, autotuning)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    for name, b in trials.items():
        budget.copy_(b)
        g.replay()
        torch.cuda.synchronize()
        yield name, all(torch.equal(a, e) for a, e in zip(static, eager[name])), static


def check_fused_barrier() -> None:
    from base_sglang.kernels.base_fused import base_fused_select

    cases = []
    for i, (T, shape) in enumerate([(1, "qwen3-30b-a3b"), (16, "qwen3-30b-a3b"), (200, "qwen3-30b-a3b"),
                                    (7, "olmoe-1b-7b"), (64, "olmoe-1b-7b"), (33, "qwen3-30b-a3b")]):
        if shape not in SHAPES:  # --shapes narrowed the run
            continue
        s = SHAPES[shape]
        E, K, H = s["E"], s["K"], s["H"]
        pred = make_predictor(E, H, seed=i)
        r = make_routing(T, E, K, s["norm_topk_prob"], seed=100 + i)
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        bud = torch.randint(K // 2, E, (T,), device=DEVICE)
        cfg = SelectionConfig()  # the default policy
        ref = select_experts(r.logits, r.ids, r.weights, hidden, bud, 0, cfg, pred,
                             norm_topk_prob=s["norm_topk_prob"])
        kw = dict(combine=cfg.combine_mode(s["norm_topk_prob"]), alpha=cfg.renorm_alpha)
        args = (hidden, r.ids, r.weights, r.logits, bud, pred.weight[0], pred.bias[0])
        first = base_fused_select(*args, **kw)
        cases.append((args, kw, ref, first))
    if not cases:
        return
    bad = 0
    for n in range(300):  # consecutive launches with different grids on one stream
        args, kw, ref, first = cases[(n * 7) % len(cases)]
        got = base_fused_select(*args, **kw)
        bad += int(not (torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])))
    torch.cuda.synchronize()
    core_ok = all(torch.equal(f[0], ref.ids) and (f[1] - ref.weights).abs().max().item() <= 1e-5
                  for _, _, ref, f in cases)
    record("fused/alternating_grids", bad == 0 and core_ok, calls=300, mismatches=bad,
           first_calls_equal_core=core_ok)
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs = [[], []]
    for n in range(50):  # two streams, each its own barrier counter
        for j, st in enumerate(streams):
            with torch.cuda.stream(st):
                args, kw, _, _ = cases[(n + 3 * j) % len(cases)]
                outs[j].append(((n + 3 * j) % len(cases), base_fused_select(*args, **kw)))
    torch.cuda.synchronize()
    bad = sum(int(not torch.equal(o[0], cases[c][3][0])) for lst in outs for c, o in lst)
    record("fused/two_streams", bad == 0, calls=100, mismatches=bad)
    bad = 0
    for args, kw, _, first in cases:
        got = base_fused_select(*args, **kw, cooperative=False)
        bad += int(not (torch.equal(got[0], first[0]) and torch.equal(got[1], first[1])))
    torch.cuda.synchronize()
    record("fused/non_cooperative_equal", bad == 0, cases=len(cases), mismatches=bad)


def check_graph() -> None:
    s = ALL_SHAPES["qwen3-30b-a3b"]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    T = 16
    pred = make_predictor(E, H)
    gate_up, down = make_experts(E, H, I, seed=1)
    r = make_routing(T, E, K, True, seed=3)
    hidden = torch.randn(T, H, device=DEVICE).bfloat16()
    cfg = SelectionConfig(policy="base")
    budget = torch.full((T,), 10, dtype=torch.int64, device=DEVICE)  # static buffer

    def step():
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden, budget, 0, cfg, pred)
        return sel.ids, sel.weights, fused_moe(hidden, sel.ids, sel.weights, gate_up, down)

    trials = {"M8": torch.full((T,), 8), "M16": torch.full((T,), 16),
              "mixed_padded": torch.tensor([-1, 4, 12, 30] * 4), "dense": torch.full((T,), E)}
    for name, same, static in graph_replays(step, budget, trials):
        nk = int((torch.zeros(E, dtype=torch.bool, device=DEVICE)
                  .scatter_(0, static[0][static[0] >= 0].long(), True)).sum())
        record(f"graph_replay/{name}", same, experts_kept=nk)


def check_nan_dropped() -> None:
    for shape in [k for k in ("qwen3-30b-a3b", "olmoe-1b-7b") if k in SHAPES]:
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        T = 16
        pred = make_predictor(E, H)
        gate_up, down = make_experts(E, H, I, seed=2)
        r = make_routing(T, E, K, s["norm_topk_prob"], seed=5)
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                  torch.full((T,), 10, device=DEVICE), 0,
                                  SelectionConfig(policy="base"), pred,
                                  norm_topk_prob=s["norm_topk_prob"])
        kept = torch.zeros(E, dtype=torch.bool, device=DEVICE)
        kept[sel.ids[sel.ids >= 0].long()] = True
        ref = moe_forward_ref(hidden.float(), sel.ids.long(), sel.weights.float(),
                              gate_up.float(), down.float())
        gu_nan, dn_nan = gate_up.clone(), down.clone()
        gu_nan[~kept] = float("nan")
        dn_nan[~kept] = float("nan")
        y = fused_moe(hidden, sel.ids, sel.weights, gu_nan, dn_nan).float()
        rel = ((y - ref).norm() / ref.norm()).item()
        record(f"nan_dropped/{shape}", bool(torch.isfinite(y).all()) and rel < 1e-2,
               kept=int(kept.sum()), rel_err_vs_fp32=rel)


BASE_PLUS_TOKENS = (1, 16, 64)
BASE_PLUS_CONFIGS = [("base_plus", "native", a) for a in (0.0, 0.5, 1.0)] + [("base", "partial", 0.5)]


def check_base_plus() -> None:
    """base_plus / partial: kernel vs core at the Qwen3 shape, with both norm_topk_prob conventions."""
    s = ALL_SHAPES["qwen3-30b-a3b"]
    E, K, H = s["E"], s["K"], s["H"]
    pred = make_predictor(E, H)
    for T in BASE_PLUS_TOKENS:
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        for norm in (True, False):
            r = make_routing(T, E, K, norm, seed=100 + T)
            bad, max_diff, id_rows, cases = [], 0.0, 0, 0
            for bname, bud in budgets(T, E, K).items():
                for dt in (torch.int32, torch.int64):
                    for policy, renorm, alpha in BASE_PLUS_CONFIGS:
                        for backfill in (True, False):
                            cfg = SelectionConfig(policy=policy, renorm=renorm, renorm_alpha=alpha,
                                                  backfill=backfill)
                            args = (r.logits, r.ids.to(dt), r.weights, hidden, bud, 0, cfg, pred)
                            ref = select_experts(*args, norm_topk_prob=norm)
                            got = base_select_experts(*args, norm_topk_prob=norm)
                            cases += 1
                            diff = (ref.weights - got.weights).abs().max().item()
                            rows = int((ref.ids != got.ids).any(1).sum())
                            max_diff, id_rows = max(max_diff, diff), id_rows + rows
                            ok = (rows == 0 and ref.ids.dtype == got.ids.dtype and diff <= 1e-5
                                  and int(ref.stats.num_union) == int(got.stats.num_union)
                                  and int(ref.stats.num_kept) == int(got.stats.num_kept))
                            if not ok:
                                bad.append((bname, str(dt), policy, renorm, alpha, backfill, rows,
                                            diff))
            record(f"base_plus/qwen3-30b-a3b/T={T}/norm={norm}", not bad, cases=cases,
                   max_abs_weight_diff=max_diff, id_mismatch_rows=id_rows, failures=bad[:4])


def check_graph_base_plus() -> None:
    """base_plus captured once in a CUDA graph, replayed with changed budgets == eager (bitwise)."""
    s = ALL_SHAPES["qwen3-30b-a3b"]
    E, K, H = s["E"], s["K"], s["H"]
    T = 16
    pred = make_predictor(E, H)
    r = make_routing(T, E, K, True, seed=4)
    hidden = torch.randn(T, H, device=DEVICE).bfloat16()
    cfg = SelectionConfig(policy="base_plus")
    budget = torch.full((T,), 10, dtype=torch.int64, device=DEVICE)

    def step():
        sel = base_select_experts(r.logits, r.ids, r.weights, hidden, budget, 0, cfg, pred)
        return sel.ids, sel.weights

    trials = {"M4": torch.full((T,), 4), "M16": torch.full((T,), 16),
              "mixed_padded": torch.tensor([-1, 4, 12, 30] * 4), "dense": torch.full((T,), E)}
    for name, same, _static in graph_replays(step, budget, trials):
        record(f"graph_replay_base_plus/{name}", same)


def time_base_plus(out_dir: str) -> None:
    """Selection latency of base vs base_plus (both launches, graph replay) at the Qwen3 shape."""
    s = ALL_SHAPES["qwen3-30b-a3b"]
    E, K, H = s["E"], s["K"], s["H"]
    pred = make_predictor(E, H)
    rows = []
    print(f"{'T':>4} {'base_us':>8} {'base_plus_us':>12} {'ratio':>6}", flush=True)
    for T in BASE_PLUS_TOKENS:
        r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
        x = torch.randn(T, H, device=DEVICE).bfloat16()
        bud = torch.full((T,), 16, device=DEVICE)
        us = {}
        for policy in ("base", "base_plus", "base", "base_plus"):  # interleaved, best of two
            cfg = SelectionConfig(policy=policy)
            t = graph_time_us(lambda: base_select_experts(  # noqa: B023
                r.logits, r.ids, r.weights, x, bud, 0, cfg, pred,  # noqa: B023
                norm_topk_prob=s["norm_topk_prob"]))
            us[policy] = min(us.get(policy, float("inf")), t)
        ratio = us["base_plus"] / us["base"]
        rows.append(dict(shape="qwen3-30b-a3b", T=T, M=16, base_us=round(us["base"], 2),
                         base_plus_us=round(us["base_plus"], 2), ratio=round(ratio, 3)))
        print(f"{T:>4} {us['base']:>8.2f} {us['base_plus']:>12.2f} {ratio:>6.3f}", flush=True)
        record(f"latency_base_plus_vs_base/T={T}", ratio <= 1.2 or DEVICE != "cuda", **rows[-1])
    write_rows(os.path.join(out_dir, "base_plus_latency.csv"), rows,
               provenance({"tokens": list(BASE_PLUS_TOKENS), "budget": "M=16",
                           "timing": "CUDA graph of 10 calls, median of 15 replays, best of 2"}))


def check_fused_moe() -> None:
    for shape, s in SHAPES.items():
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        gate_up, down = make_experts(E, H, I, seed=4)
        for T in TOKENS:
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            ids = r.ids.clone()
            ids[0, -1] = -1  # one dropped slot
            y1 = fused_moe(hidden, ids, r.weights, gate_up, down)
            y2 = fused_moe(hidden, ids.long(), r.weights, gate_up, down)
            ref = moe_forward_ref(hidden.float(), ids.long(), r.weights, gate_up.float(),
                                  down.float())
            rel = ((y1.float() - ref).norm() / ref.norm()).item()
            record(f"fused_moe/{shape}/T={T}", rel < 1e-2 and torch.equal(y1, y2),
                   rel_err_vs_fp32=rel, deterministic=torch.equal(y1, y2))


MOE_PATHS = {"grouped": dict(pair_major=False, one_launch=False),
             "pair": dict(pair_major=True, one_launch=False),
             "one": dict(pair_major=False, one_launch=True),
             "one2": dict(pair_major=False, one_launch=True, ctas_per_sm=2)}


MOE_ONLY: set[str] = set()  # --moe-paths: check only these structures (default: every one)


def moe_config(T: int, E: int, K: int, path: dict):
    import dataclasses

    return dataclasses.replace(default_config(T, E, K), **path)


def check_moe_paths() -> None:
    """Every launch structure of fused_moe == the fp32 reference at real shapes, including a
    dropped slot and a token with every slot dropped; the fused combine bit-equal to the launch."""
    for shape, s in SHAPES.items():
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        gate_up, down = make_experts(E, H, I, seed=4)
        for T in (1, 2, 16, 64):
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            ids = r.ids.clone()
            ids[0, -1] = -1
            if T > 1:
                ids[-1] = -1
            ref = moe_forward_ref(hidden.float(), ids.long(), r.weights, gate_up.float(), down.float())
            outs = {}
            for name, pm in (*MOE_PATHS.items(), ("default", None)):  # default: the tuned rows
                if MOE_ONLY and name not in MOE_ONLY:
                    continue
                cfg = None if pm is None else moe_config(T, E, K, pm)
                y = fused_moe(hidden, ids, r.weights, gate_up, down, config=cfg)
                again = fused_moe(hidden, ids, r.weights, gate_up, down, config=cfg)
                rel = ((y.float() - ref).norm() / ref.norm()).item()
                outs[name] = y
                zero_row = T == 1 or bool((y[-1] == 0).all())
                record(f"moe/{shape}/T={T}/{name}", rel < 1e-2 and torch.equal(y, again) and zero_row,
                       rel_err_vs_fp32=rel, deterministic=torch.equal(y, again), zero_row=zero_row)
            for other in [o for o in ("pair", "one", "one2") if o in outs and "grouped" in outs]:
                rel = ((outs[other].float() - outs["grouped"].float()).norm()
                       / outs["grouped"].float().norm()).item()
                record(f"moe/{shape}/T={T}/{other}_vs_grouped", rel < 1e-2, rel=rel)


def check_moe_budget_rows() -> None:
    """The shipped "budget" rows at BASE budgets M = 8, 16 (T = 4, 8, 16: fewer units than programs at
    M = 8, where idle_low acts) == the fp32 reference, run-to-run bit-equal, and bit-equal to the same
    row with idle_low flipped (the same units, other programs)."""
    import dataclasses

    for shape, s in SHAPES.items():
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        if E <= 16:
            continue
        gate_up, down = make_experts(E, H, I, seed=5)
        for T in (4, 8, 16):
            for M in (8, 16):
                r = make_routing(T, E, K, s["norm_topk_prob"], seed=100 + T + M)
                keep = torch.randperm(E, generator=torch.Generator().manual_seed(M))[:M].to(DEVICE)
                ids = torch.stack([keep[torch.randperm(M, generator=torch.Generator().manual_seed(t))[:K]
                                        .to(DEVICE)] for t in range(T)]).int()  # [T, K] within S
                ids[0, -1] = -1
                hidden = torch.randn(T, H, device=DEVICE).bfloat16()
                ref = moe_forward_ref(hidden.float(), ids.long(), r.weights, gate_up.float(), down.float())
                gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else None
                cfg = default_config(T, E, K, M, hidden=H, inter=I, gpu=gpu)
                y = fused_moe(hidden, ids, r.weights, gate_up, down, config=cfg)
                again = fused_moe(hidden, ids, r.weights, gate_up, down, config=cfg)
                flip = fused_moe(hidden, ids, r.weights, gate_up, down,
                                 config=dataclasses.replace(cfg, idle_low=1 - cfg.idle_low))
                rel = ((y.float() - ref).norm() / ref.norm()).item()
                record(f"moe_budget/{shape}/T={T}/M={M}", rel < 1e-2 and torch.equal(y, again)
                       and torch.equal(y, flip), rel_err_vs_fp32=rel, one_launch=cfg.one_launch,
                       idle_low=cfg.idle_low, deterministic=torch.equal(y, again),
                       idle_low_flip_equal=torch.equal(y, flip))


def check_moe_graph() -> None:
    """Selection + fused_moe (pair-major at T=1, grouped at T=16) in one CUDA graph: replays with
    new budgets == eager; two streams."""
    s = ALL_SHAPES["qwen3-30b-a3b"]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    pred = make_predictor(E, H)
    gate_up, down = make_experts(E, H, I, seed=1)
    for T, path in ((1, "pair"), (16, "grouped"), (1, "one"), (16, "one"), (32, "one2")):
        if MOE_ONLY and path not in MOE_ONLY:
            continue
        r = make_routing(T, E, K, True, seed=3)
        hidden = torch.randn(T, H, device=DEVICE).bfloat16()
        budget = torch.full((T,), 10, dtype=torch.int64, device=DEVICE)
        cfg = moe_config(T, E, K, MOE_PATHS[path])

        def step(r=r, hidden=hidden, budget=budget, cfg=cfg):
            sel = base_select_experts(r.logits, r.ids, r.weights, hidden, budget, 0,
                                      SelectionConfig(policy="base"), pred)
            return sel.ids, fused_moe(hidden, sel.ids, sel.weights, gate_up, down, config=cfg)

        trials = {"M4": torch.full((T,), 4), "M16": torch.full((T,), 16), "dense": torch.full((T,), E),
                  "padded": torch.full((T,), -1)}
        for name, same, _ in graph_replays(step, budget, trials):
            record(f"moe_graph/T={T}/{path}/{name}", same)
    T = 16
    r = make_routing(T, E, K, True, seed=5)
    hidden = torch.randn(T, H, device=DEVICE).bfloat16()
    for path in ("grouped", "one"):  # one: each stream has its own sync entries
        if MOE_ONLY and path not in MOE_ONLY:
            continue
        cfg = moe_config(T, E, K, MOE_PATHS[path])
        want = fused_moe(hidden, r.ids, r.weights, gate_up, down, config=cfg)
        streams = [torch.cuda.Stream() for _ in range(2)]
        outs = [[], []]
        for st in streams:
            st.wait_stream(torch.cuda.current_stream())
        for _ in range(20):
            for i, st in enumerate(streams):
                with torch.cuda.stream(st):
                    outs[i].append(fused_moe(hidden, r.ids, r.weights, gate_up, down, config=cfg))
        torch.cuda.synchronize()
        record(f"moe_two_streams/{path}", all(torch.equal(y, want) for o in outs for y in o),
               launches=40)


def check_sched() -> None:
    """base_sched's in-kernel table lookup (both selection kernels) == the core on the GPU."""
    for shape in [sh for sh in ("qwen3-30b-a3b", "olmoe-1b-7b") if sh in SHAPES]:
        s = SHAPES[shape]
        E, K, H = s["E"], s["K"], s["H"]
        pred = make_predictor(E, H)
        g = torch.Generator().manual_seed(1)
        # two batch-size ranges (rows 1-8, 9+), each a non-monotone table on purpose
        table = torch.randint(0, E + 1, (2, 1, E + 1), generator=g).float()
        pred.layer_budget, pred.layer_budget_max_batch = table.to(DEVICE), torch.tensor([8.0])
        for T in (1, 16, 64):
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            bad = []
            for kernel in ("fused", "two"):
                os.environ["BASE_SELECT_KERNEL"] = kernel
                for M in (0, 3, K, 2 * K, E // 2, E):
                    cfg = SelectionConfig(policy="base_sched")
                    bud = torch.full((T,), M, device=DEVICE)
                    args = (r.logits, r.ids, r.weights, hidden, bud, 0, cfg, pred)
                    ref = select_experts(*args, norm_topk_prob=s["norm_topk_prob"])
                    got = base_select_experts(*args, norm_topk_prob=s["norm_topk_prob"])
                    if not (torch.equal(ref.ids, got.ids)
                            and (ref.weights - got.weights).abs().max().item() <= 1e-5):
                        bad.append((kernel, M))
            os.environ.pop("BASE_SELECT_KERNEL", None)
            record(f"sched/{shape}/T={T}", not bad, failures=bad[:6])


def route_case(shape: str, T: int, seed: int = 0):
    """(folded GEMM weight [2E, H], z [T, H], predictor) for one shape: a random bf16 router."""
    from base_sglang.core.routing import fold_router

    s = ALL_SHAPES[shape]
    E, H = s["E"], s["H"]
    pred = make_predictor(E, H, seed=seed)
    g = torch.Generator().manual_seed(seed)
    router = (torch.randn(E, H, generator=g) * H ** -0.5).to(DEVICE, torch.bfloat16)
    z = torch.randn(T, H, generator=g).to(DEVICE, torch.bfloat16)
    return fold_router(router, pred, 0), z, pred


def route_diff(logits, yhat, bud, cfg, pred, K: int, norm: bool):
    """(route-select == core.routing.route_select: ids exact, weights <= 1e-5, same statistics;
    the max |weight diff|; rows whose ids differ) for one folded layer."""
    from base_sglang.core.routing import route_select
    from base_sglang.kernels import route_select_experts

    ref, _, _ = route_select(logits, yhat, bud, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
    got = route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
    diff = (ref.weights.float() - got.weights).abs().max().item()
    ok = (torch.equal(ref.ids, got.ids.long()) and diff <= 1e-5
          and int(ref.stats.num_union) == int(got.stats.num_union)
          and int(ref.stats.num_kept) == int(got.stats.num_kept))
    return ok, diff, int((ref.ids != got.ids.long()).any(1).sum())


def route_cases(logits, yhat, pred, K: int, norm: bool, settings) -> tuple[list, float]:
    """route_diff over every budget kind x (policy, backfill) setting: (failures, worst weight diff)."""
    T, E = logits.shape
    bad, worst = [], 0.0
    for bname, bud in budgets(T, E, K).items():
        for policy, backfill in settings:
            cfg = SelectionConfig(policy=policy, backfill=backfill)
            ok, diff, rows = route_diff(logits, yhat, bud, cfg, pred, K, norm)
            worst = max(worst, diff)
            if not ok:
                bad.append((bname, policy, backfill, rows))
    return bad, worst


def check_route() -> None:
    from base_sglang.kernels import route_select_experts

    for shape, s in SHAPES.items():
        E, K = s["E"], s["K"]
        for T in ((1, 16, 64) if DEVICE == "cuda" else (1, 5)):
            w2, z, pred = route_case(shape, T, seed=T)
            scores = z @ w2.T  # [T, 2E] bf16, one GEMM
            logits, yhat = scores[:, :E], scores[:, E:]
            settings = [(p, bf) for p in ("base", "base_plus") for bf in (True, False)]
            bad, worst = route_cases(logits, yhat, pred, K, s["norm_topk_prob"], settings)
            record(f"route/{shape}/T={T}", not bad, cases=5 * 4, max_w_diff=worst, failures=bad[:4])
            cfg = SelectionConfig(policy="base_plus")
            bud = budgets(T, E, K)["mixed"]
            first = route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K,
                                         norm_topk_prob=s["norm_topk_prob"])
            same = all(torch.equal(first.ids, o.ids) and torch.equal(first.weights, o.weights)
                       for o in (route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K,
                                                      norm_topk_prob=s["norm_topk_prob"])
                                 for _ in range(50)))
            record(f"route_repeat/{shape}/T={T}", same, calls=50)


def check_route_tiles() -> None:
    """Every tile variant the sweep times (kernel_common.ROUTE_VARIANTS) == the core, so that any of
    them can become a default: BASE_ROUTE_TILES = num_warps, rows per block, iterative top-k,
    scratch row."""
    from kernel_common import ROUTE_VARIANTS

    for shape, T, tiles in [(sh, T, v) for sh in ("qwen3-30b-a3b", "olmoe-1b-7b") if sh in SHAPES
                            for T, vs in ROUTE_VARIANTS.items() for v in vs]:
        s = SHAPES[shape]
        E, K = s["E"], s["K"]
        w2, z, pred = route_case(shape, T, seed=T + 100)
        scores = z @ w2.T
        logits, yhat = scores[:, :E], scores[:, E:]
        bad = []
        os.environ["BASE_ROUTE_TILES"] = tiles
        try:
            for bname, bud in budgets(T, E, K).items():
                ok, _, _ = route_diff(logits, yhat, bud, SelectionConfig(policy="base_plus"), pred,
                                      K, s["norm_topk_prob"])
                if not ok:
                    bad.append(bname)
        finally:
            os.environ.pop("BASE_ROUTE_TILES", None)
        record(f"route_tiles/{shape}/T={T}/{tiles}", not bad, failures=bad)


def check_route_compact() -> None:
    """The narrow backfill (|S| <= COMPACT: a [BT, COMPACT] tile of S's columns) against the same
    tiles with it off (compact 0): ids, weights, counts and removed cost bitwise equal (the combine's
    slot sums run in a fixed order, base_fused.slot_sum, whatever layout each path leaves)."""
    from base_sglang.kernels import route_select_experts
    from base_sglang.kernels.base_route import route_blocks

    for shape, T in [(sh, T) for sh in ("qwen3-30b-a3b", "olmoe-1b-7b") if sh in SHAPES
                     for T in (1, 8, 16, 32, 64)]:
        s = SHAPES[shape]
        E, K = s["E"], s["K"]
        w2, z, pred = route_case(shape, T, seed=T + 200)
        scores = z @ w2.T
        logits, yhat = scores[:, :E], scores[:, E:]
        c = route_blocks(T, E, K)
        tiles = f"{c['num_warps']},{c['BLOCK_T']},{int(c['ITER'])},{int(c['SCRATCH'])}"
        width = c["COMPACT"]
        buds = dict(budgets(T, E, K), at=torch.full((T,), width, device=DEVICE),
                    below=torch.full((T,), width - 1, device=DEVICE),
                    above=torch.full((T,), width + 1, device=DEVICE))
        bad, bit_equal, worst = [], True, 0.0
        for policy, renorm in (("base_plus", "native"), ("base", "native"), ("base", "never")):
            cfg = SelectionConfig(policy=policy, renorm=renorm)
            for bname, bud in buds.items():
                out = []
                for comp in (0, width):
                    os.environ["BASE_ROUTE_TILES"] = f"{tiles},{comp}"
                    try:
                        out.append(route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K,
                                                        norm_topk_prob=s["norm_topk_prob"]))
                    finally:
                        os.environ.pop("BASE_ROUTE_TILES", None)
                off, on = out
                same = (torch.equal(off.ids, on.ids) and int(off.stats.num_kept) == int(on.stats.num_kept)
                        and int(off.stats.num_union) == int(on.stats.num_union)
                        and torch.equal(off.stats.removed_cost, on.stats.removed_cost))
                diff = float((off.weights - on.weights).abs().max())
                bit_equal &= torch.equal(off.weights, on.weights)
                worst = max(worst, diff)
                if not same or not torch.equal(off.weights, on.weights):
                    bad.append(f"{policy}/{renorm}/{bname}")
        record(f"route_compact/{shape}/T={T}/w={width}", not bad, failures=bad, bit_equal=bit_equal,
               max_weight_diff=worst)


def check_route_split() -> None:
    """base_route_split (two launches) == core.routing at three shapes, T in {8, 16, 64, 128} (8: the
    H100's rule runs it from there, moe_configs.route_split_min_t), every
    budget kind, base / base_plus, backfill on and off; every SPLIT_VARIANTS tiling == the core at
    T = 64; == the one-launch kernel bit for bit at its tiling (16 rows per program) where both
    sum the same chunks; 20 repeat calls bitwise; a CUDA graph with changed budgets == eager."""
    from kernel_common import SPLIT_VARIANTS

    from base_sglang.kernels import route_select_experts

    os.environ["BASE_ROUTE"] = "split"
    try:
        if DEVICE == "cuda":  # first: the eighth session's two calls ran out of time before it
            check_route_graph(T=64, name="split_graph_replay")
        for shape, s in SHAPES.items():
            E, K, norm = s["E"], s["K"], s["norm_topk_prob"]
            for T in ((8, 16, 64, 128) if DEVICE == "cuda" else (5, 20)):
                w2, z, pred = route_case(shape, T, seed=T + 300)
                scores = z @ w2.T
                logits, yhat = scores[:, :E], scores[:, E:]
                settings = [("base_plus", True), ("base", True), ("base_plus", False)]
                bad, worst = route_cases(logits, yhat, pred, K, norm, settings)
                record(f"split/{shape}/T={T}", not bad, cases=5 * 3, max_w_diff=worst, failures=bad[:4])
                cfg = SelectionConfig(policy="base_plus")
                bud = budgets(T, E, K)["mixed"]
                first = route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
                same = all(torch.equal(first.ids, o.ids) and torch.equal(first.weights, o.weights)
                           for o in (route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K,
                                                          norm_topk_prob=norm) for _ in range(20)))
                record(f"split_repeat/{shape}/T={T}", same, calls=20)
                if E >= 64:  # one launch at 16 rows per program vs split at the same tiling
                    os.environ["BASE_ROUTE_SPLIT_TILES"] = "16,8,8"
                    os.environ["BASE_ROUTE_TILES"] = "8,16,0,1"
                    two = route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
                    os.environ["BASE_ROUTE"] = "fold"
                    one = route_select_experts(logits, yhat, bud, 0, cfg, pred, top_k=K, norm_topk_prob=norm)
                    os.environ["BASE_ROUTE"] = "split"
                    for k in ("BASE_ROUTE_SPLIT_TILES", "BASE_ROUTE_TILES"):
                        os.environ.pop(k, None)
                    record(f"split_vs_fold_bitwise/{shape}/T={T}",
                           torch.equal(one.ids, two.ids) and torch.equal(one.weights, two.weights))
        for shape in [x for x in ("qwen3-30b-a3b", "olmoe-1b-7b") if x in SHAPES]:  # --shapes
            s = SHAPES[shape]
            E, K, T = s["E"], s["K"], (64 if DEVICE == "cuda" else 9)
            w2, z, pred = route_case(shape, T, seed=T + 400)
            scores = z @ w2.T
            logits, yhat = scores[:, :E], scores[:, E:]
            for tiles in SPLIT_VARIANTS:
                os.environ["BASE_ROUTE_SPLIT_TILES"] = tiles
                try:
                    bad = [b for b, bud in budgets(T, E, K).items()
                           if not route_diff(logits, yhat, bud, SelectionConfig(policy="base_plus"),
                                             pred, K, s["norm_topk_prob"])[0]]
                finally:
                    os.environ.pop("BASE_ROUTE_SPLIT_TILES", None)
                record(f"split_tiles/{shape}/T={T}/{tiles}", not bad, failures=bad)
    finally:
        os.environ.pop("BASE_ROUTE", None)


def check_route_graph(T: int = 16, name: str = "route_graph_replay") -> None:
    from base_sglang.kernels import route_select_experts

    shape = "qwen3-30b-a3b"
    s = ALL_SHAPES[shape]
    E, K = s["E"], s["K"]
    w2, z, pred = route_case(shape, T, seed=3)
    cfg = SelectionConfig(policy="base_plus")
    budget = torch.full((T,), 10, device=DEVICE)

    def step():
        scores = z @ w2.T
        sel = route_select_experts(scores[:, :E], scores[:, E:], budget, 0, cfg, pred, top_k=K,
                                   norm_topk_prob=True)
        return sel.ids, sel.weights, sel.stats.num_kept

    trials = budgets(T, E, K)
    bad = [name for name, ok, _ in graph_replays(step, budget, trials) if not ok]
    record(name, not bad, trials=len(trials), failures=bad)


def main() -> int:
    global SHAPES, TOKENS
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--quick", action="store_true", help="Qwen3 shape only, fewer T")
    ap.add_argument("--only", choices=["base_plus", "graph", "fused", "barrier", "moe", "route",
                                       "compact", "split", "sched"],
                    help="run one group of sections only")
    ap.add_argument("--shapes", default="", help="comma-separated shape names (default: all)")
    ap.add_argument("--moe-paths", default="", help=f"sections 8-9 only for these of {sorted(MOE_PATHS)}"
                    " and default")
    args = ap.parse_args()
    if args.moe_paths:
        unknown = set(args.moe_paths.split(",")) - set(MOE_PATHS) - {"default"}
        if unknown:
            ap.error(f"--moe-paths: unknown {sorted(unknown)}; known {sorted(MOE_PATHS)} and default")
        MOE_ONLY.update(args.moe_paths.split(","))
    if args.shapes:
        unknown = set(args.shapes.split(",")) - set(SHAPES)
        if unknown:
            ap.error(f"--shapes: unknown {sorted(unknown)}; known {sorted(SHAPES)}")
        SHAPES = {k: v for k, v in SHAPES.items() if k in args.shapes.split(",")}
    if args.quick:
        SHAPES = {"qwen3-30b-a3b": SHAPES["qwen3-30b-a3b"]}
        TOKENS = (16, 128)
    torch.manual_seed(0)
    def latency_base_plus():
        time_base_plus(args.out)

    base_plus = [check_base_plus, check_graph_base_plus, latency_base_plus]
    checks = [check_selection, check_graph, check_nan_dropped, check_fused_moe, *base_plus,
              check_fused_barrier, check_route, check_route_graph]
    if args.only == "base_plus":
        checks = base_plus
    elif args.only == "barrier":
        checks = [check_fused_barrier]
    elif args.only == "fused":
        checks = [check_selection, check_graph, check_base_plus, check_graph_base_plus,
                  check_fused_barrier]
    elif args.only == "moe":
        checks = [check_moe_paths, check_moe_budget_rows, check_moe_graph, check_sched]
    elif args.only == "route":
        checks = [check_route, check_route_graph, check_route_tiles, check_sched]
    elif args.only == "compact":
        checks = [check_route_compact]
    elif args.only == "split":
        checks = [check_route_split]
    elif args.only == "sched":
        checks = [check_sched]
    elif args.only == "graph":
        checks = [check_graph, check_graph_base_plus]
    if DEVICE != "cuda":  # CPU dry run: no graphs
        checks = [c for c in checks if c not in (check_graph, check_graph_base_plus,
                                                  check_fused_barrier, check_moe_graph,
                                                  check_route_graph)]
    for fn in checks:
        try:
            fn()
        except Exception as e:  # keep going: report every section
            traceback.print_exc()
            record(fn.__name__, False, error=repr(e))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "checks.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu",
                   "commit": os.environ.get("BASE_COMMIT", "unknown"), "checks": RESULTS}, f, indent=1)
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(f"{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed; failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
