"""What one launch can read: the kept experts' bytes streamed with no compute (issue 12, byte floor).

    python benchmarks/gpu/read_floor.py --out DIR [--shapes qwen3-30b-a3b] [--tokens 16]
        [--budgets 8,16] [--grids 1,2,3,4] [--chunks 16384,65536] [--stages 2,4] [--warps 4,8]
The byte floor of bench_fused_moe.py is experts read x bytes per expert / the copy rate of a 2 GiB
copy: an asymptote no single short launch reaches. This measures the launch that comes closest to
it for the same bytes: a grid of G = grids x SMs programs sums (fp32) every element of the kept
experts' gate_up [2I, H] and down [H, I] (the set base_select_experts keeps, policy base, random
predictor, as sweep_moe.py and trace_moe_one.py pick it), chunk c = p, p + G, ... of CH elements,
gate_up chunks before down chunks, expert by expert (the one-launch MoE's unit order), each chunk
in BLOCK = min(4096, CH)-element loads pipelined over `stages`; PDL as the MoE kernels launch. Timed as the
MoE sweeps are: CUDA graph of 10 calls, median of 15 replays, 3 rotating weight copies. Modes:
"all" (every byte the MoE reads) and "up" (gate_up only: the up phase's bytes). --tiles
UPC:BN1:BK1:BN2:BK2 adds the pattern "tiles": the same bytes in moe_one's weight tiles and unit order
(up units of UPC rows of gate and of up in [BK1, BN1] loads over H, then down units of BN2 rows in
[BK2, BN2] loads over I), i.e. the MoE's reads without its compute, align and waits.
Prints a table; writes read_floor.json (every cell, the best per (shape, T, M, mode), provenance).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_fused_moe import COPIES, rotating  # noqa: E402
from kernel_common import (  # noqa: E402
    DEVICE,
    SHAPES,
    copy_bandwidth_gbs,
    graph_time_us,
    make_experts,
    make_routing,
    provenance,
)

from base_sglang.core import SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts  # noqa: E402
from base_sglang.kernels.utils import launch_kwargs, num_sms, use_pdl  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

BLOCK = 4096


@triton.jit
def _read_kernel(gu_ptr, dn_ptr, kept_ptr, out_ptr, n_chunks, n_prog,
                 GU_N: tl.constexpr, DN_N: tl.constexpr, GU_CH: tl.constexpr, DN_CH: tl.constexpr,
                 CH: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    offs = tl.arange(0, BLOCK)
    for c in range(pid, n_chunks, n_prog):
        j = c // (GU_CH + DN_CH)  # kept expert j, chunk r of its gate_up then down
        r = c % (GU_CH + DN_CH)
        e = tl.load(kept_ptr + j).to(tl.int64)
        if r < GU_CH:
            src = gu_ptr + e * GU_N + r * CH
        else:
            src = dn_ptr + e * DN_N + (r - GU_CH) * CH
        for i in tl.range(0, CH, BLOCK, num_stages=STAGES):
            acc += tl.load(src + i + offs).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def _read_tiles_kernel(gu_ptr, dn_ptr, kept_ptr, out_ptr, n_act, n_prog,
                       H: tl.constexpr, I: tl.constexpr, UPC: tl.constexpr, BN1: tl.constexpr,  # noqa: E741
                       BK1: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr, DOWN: tl.constexpr,
                       STAGES: tl.constexpr, USE_PDL: tl.constexpr):
    """moe_one's weight reads alone: up units (j, UPC rows of gate and of up, [BK1, BN1] tiles over
    H), then down units (j, BN2 rows of down, [BK2, BN2] tiles over I), unit u on program u mod G."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    NT1: tl.constexpr = (I + UPC - 1) // UPC
    NT2: tl.constexpr = (H + BN2 - 1) // BN2
    pid = tl.program_id(0)
    ks1 = tl.arange(0, BK1)
    ks2 = tl.arange(0, BK2)
    acc1 = tl.zeros([BK1, BN1], dtype=tl.float32)
    acc2 = tl.zeros([BK2, BN2], dtype=tl.float32)
    u1 = n_act * NT1
    total = u1 + (n_act * NT2 if DOWN else 0)
    for u in range(pid, total, n_prog):
        if u < u1:  # (names differ per branch: the compiler joins same-named values of both)
            e1 = tl.load(kept_ptr + u // NT1).to(tl.int64)
            ns1 = (u % NT1) * UPC + tl.arange(0, BN1)  # [BN1]
            nmask1 = (tl.arange(0, BN1) < UPC) & (ns1 < I)
            w1 = gu_ptr + e1 * (2 * I * H) + ns1[None, :].to(tl.int64) * H + ks1[:, None]
            for k0 in tl.range(0, H, BK1, num_stages=STAGES):
                m1 = ((ks1 < H - k0)[:, None]) & nmask1[None, :]
                acc1 += tl.load(w1 + k0, mask=m1, other=0.0).to(tl.float32)
                acc1 += tl.load(w1 + k0 + I * H, mask=m1, other=0.0).to(tl.float32)
        else:
            e2 = tl.load(kept_ptr + (u - u1) // NT2).to(tl.int64)
            ns2 = ((u - u1) % NT2) * BN2 + tl.arange(0, BN2)  # [BN2]
            w2 = dn_ptr + e2 * (H * I) + ns2[None, :].to(tl.int64) * I + ks2[:, None]
            for k0 in tl.range(0, I, BK2, num_stages=STAGES):
                m2 = ((ks2 < I - k0)[:, None]) & (ns2 < H)[None, :]
                acc2 += tl.load(w2 + k0, mask=m2, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(tl.sum(acc1, axis=1), axis=0) + tl.sum(tl.sum(acc2, axis=1), axis=0))


def read_kept(gu: torch.Tensor, dn: torch.Tensor, kept: torch.Tensor, out: torch.Tensor, *,
              programs: int, chunk: int, stages: int, warps: int, mode: str,
              tiles: tuple[int, ...] | None = None) -> torch.Tensor:
    """out[p] = sum of program p's chunks of the kept experts' weights (fp32); tiles = (UPC, BN1,
    BK1, BN2, BK2): in moe_one's tiles and unit order instead of flat chunks."""
    E, two_i, H = gu.shape
    pdl = use_pdl(gu.device)
    if tiles:
        upc, bn1, bk1, bn2, bk2 = tiles
        _read_tiles_kernel[(programs,)](gu, dn, kept, out, kept.numel(), programs, H=H, I=two_i // 2,
                                        UPC=upc, BN1=bn1, BK1=bk1, BN2=bn2, BK2=bk2,
                                        DOWN=mode == "all", STAGES=stages, USE_PDL=pdl,
                                        num_warps=warps, **launch_kwargs(pdl))
        return out
    gu_n, dn_n = two_i * H, dn.shape[1] * dn.shape[2]
    block = min(BLOCK, chunk)
    assert gu_n % chunk == 0 and dn_n % chunk == 0 and chunk % block == 0
    gu_ch, dn_ch = gu_n // chunk, (dn_n // chunk if mode == "all" else 0)
    n_chunks = kept.numel() * (gu_ch + dn_ch)
    _read_kernel[(programs,)](gu, dn, kept, out, n_chunks, programs, GU_N=gu_n, DN_N=dn_n,
                              GU_CH=gu_ch, DN_CH=dn_ch, CH=chunk, BLOCK=block, STAGES=stages,
                              USE_PDL=pdl, num_warps=warps, **launch_kwargs(pdl))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", default="16")
    ap.add_argument("--budgets", default="8,16")
    ap.add_argument("--grids", default="1,2,3,4", help="programs per SM")
    ap.add_argument("--chunks", default="16384,65536", help="elements per chunk (multiples of 4096)")
    ap.add_argument("--stages", default="2,4")
    ap.add_argument("--warps", default="4,8")
    ap.add_argument("--modes", default="all,up")
    ap.add_argument("--tiles", default="", help="UPC:BN1:BK1:BN2:BK2: also read in moe_one's tiles and "
                    "unit order (e.g. 48:64:128:128:64, the H200 Qwen3 T = 16 row); --chunks then unused")
    ap.add_argument("--budget-s", type=float, default=240.0)
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    t_start = time.monotonic()
    bw = copy_bandwidth_gbs()
    sms = num_sms(torch.device(DEVICE))
    result = {**provenance({"copies": COPIES, "timing": "CUDA graph of 10 calls, median of 15",
                            "block": BLOCK, **vars(args)}), "copy_bw_gbs": bw, "sms": sms, "cells": [],
              "best": []}
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "read_floor.json")
    print(f"copy bandwidth {bw:.0f} GB/s, {sms} SMs", flush=True)
    print(f"{'shape':14} {'T':>3} {'M':>3} {'mode':>4} {'read':>4} {'MB':>6} {'floor':>6} {'G':>4} "
          f"{'CH':>6} {'st':>2} {'w':>2} {'us':>7} {'x fl':>5} {'TB/s':>5}", flush=True)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        for T, M in itertools.product(ints(args.tokens), ints(args.budgets)):
            r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
            hidden = torch.randn(T, H, device=DEVICE).bfloat16()
            sel = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                      torch.full((T,), M, device=DEVICE), 0,
                                      SelectionConfig(policy="base"), pred,
                                      norm_topk_prob=s["norm_topk_prob"])
            kept = torch.unique(sel.ids[sel.ids >= 0]).to(torch.int32)  # ascending, as the MoE's align
            ref = [float(torch.cat([weights[0][0][kept.long()].flatten().float(),
                                    weights[0][1][kept.long()].flatten().float()]).sum()),
                   float(weights[0][0][kept.long()].float().sum())]
            tiles = tuple(int(x) for x in args.tiles.split(":")) if args.tiles else None
            for mode, pattern in itertools.product(args.modes.split(","),
                                                   ["flat"] + (["tiles"] if tiles else [])):
                nbytes = kept.numel() * (3 if mode == "all" else 2) * H * I * 2
                floor = nbytes / (bw * 1e9) * 1e6
                best = None
                chunks = ints(args.chunks) if pattern == "flat" else [0]
                for g, ch, st, w in itertools.product(ints(args.grids), chunks,
                                                      ints(args.stages), ints(args.warps)):
                    if time.monotonic() - t_start > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s reached: stopping", flush=True)
                        json.dump(result, open(path, "w"), indent=1)
                        return 0
                    kw = dict(programs=g * sms, chunk=ch, stages=st, warps=w, mode=mode,
                              tiles=tiles if pattern == "tiles" else None)
                    out = torch.zeros(g * sms, dtype=torch.float32, device=DEVICE)
                    got = float(read_kept(weights[0][0], weights[0][1], kept, out, **kw).sum())
                    want = ref[0] if mode == "all" else ref[1]
                    ok = abs(got - want) <= 1e-3 * max(1.0, abs(want)) + 1e-2
                    t = graph_time_us(rotating(lambda i, kw=kw, out=out, wts=weights, kept=kept: read_kept(
                        wts[i][0], wts[i][1], kept, out, **kw)))
                    cell = dict(shape=shape, T=T, M=M, mode=mode, pattern=pattern, experts_read=int(kept.numel()),
                                bytes=nbytes, floor_us=round(floor, 2), programs=g * sms, chunk=ch,
                                stages=st, warps=w, us=round(t, 2), x_floor=round(t / floor, 3),
                                tbps=round(nbytes / t / 1e6, 3), sum_ok=ok)
                    result["cells"].append(cell)
                    if ok and (best is None or t < best["us"]):
                        best = cell
                    print(f"{shape:14} {T:>3} {M:>3} {mode[:2] + pattern[0]:>4} {kept.numel():>4} {nbytes / 1e6:6.1f} "
                          f"{floor:6.1f} {g * sms:>4} {ch:>6} {st:>2} {w:>2} {t:7.1f} {t / floor:5.2f} "
                          f"{nbytes / t / 1e6:5.2f}" + ("" if ok else "  SUM MISMATCH"), flush=True)
                if best:
                    result["best"].append(best)
                    print(f"  best {shape} T={T} M={M} {mode} {pattern}: {best['us']} us = {best['x_floor']}x "
                          f"floor (G {best['programs']}, CH {best['chunk']}, stages {best['stages']}, "
                          f"warps {best['warps']})", flush=True)
                json.dump(result, open(path, "w"), indent=1)
    json.dump(result, open(path, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
