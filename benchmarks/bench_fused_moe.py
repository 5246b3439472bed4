"""MoE layer latency on the GPU: dense vs BASE(M), next to the byte floor and SGLang's Triton fused MoE.

    python benchmarks/bench_fused_moe.py --out DIR [--sglang-root /tmp/sglang_whl]
For each shape (kernel_common.SHAPES), decode batch T and budget M (8, 16, 32; 2, 4, 6 for E=8):
BASE selection (Triton) picks the executed ids from skewed synthetic routing; then
  ours_us    base_sglang.kernels.fused_moe: the 2-launch decode path (moe_up + moe_down) for
             T <= 64, with a light tuning at T=16 and T=64 (a few DecodeConfigs, dense and BASE at
             the middle budget; smaller T take the T=16 winner, T=32 the T=64 one); `config`
             names the one used, `configs` in the JSON lists them
  up_us      moe_up alone (align + gate/up GEMM): ours_us - up_us is the down GEMM + combine
  sglang_us  SGLang 0.5.23's Triton MoE (sglang_triton_moe.py, its tuned H200 config) on the same
             ids; sglang_align = "in" where SGLang's own align is its Triton kernel (timed with the
             layer, as ours is), "out" where SGLang aligns with a CUDA kernel that cannot be loaded
             here (then sglang_us excludes the align: a lower bound on SGLang's layer)
  floor_us   experts read x bytes per expert / device copy bandwidth measured in this run
             (eager D2D copy, bytes read + written per second)
Times: median of CUDA-graph replays of 10 calls, rotating over 3 copies of the weights so consecutive
calls never hit L2. Writes fused_moe.csv/.json under --out after every T (partial results survive a
time limit); --deadline-s stops starting new work after that many seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_common import (  # noqa: E402
    DEVICE,
    SHAPES,
    copy_bandwidth_gbs,
    graph_time_us,
    make_experts,
    make_routing,
    provenance,
    write_rows,
)

from base_sglang.core import Predictor, PredictorMeta, SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import DecodeConfig, MoeConfig, resolve_decode  # noqa: E402
from base_sglang.kernels.moe_up import moe_up  # noqa: E402

COPIES = 3
TOKENS = "1,2,4,8,16,32,64"
TUNE_T = (16, 64)
CANDIDATES = {  # name -> DecodeConfig; "default" is the library default
    "default": DecodeConfig(),
    "pps2": DecodeConfig(programs_per_sm=2),
    "k128": DecodeConfig(up_k=128, up_stages=6, down_k=128, down_stages=8),
    "up_n32": DecodeConfig(up_n=32, up_stages=4),
    "bm32": DecodeConfig(block_m=32, up_stages=4, down_stages=5),
    "noflat": DecodeConfig(flatten=False),
    "deep": DecodeConfig(up_stages=6, down_stages=9),  # more weight bytes in flight per SM
}


def budgets_for(E: int, K: int) -> list[int]:
    ms = [m for m in (8, 16, 32) if m < E]
    return ms if len(ms) == 3 else [m for m in (K, K + 2, E - 2) if 0 < m < E]  # E=8: 2, 4, 6


def rotating(fn_i):
    state = [0]

    def fn():
        i = state[0] % COPIES
        state[0] += 1
        return fn_i(i)
    return fn


def time_ours(hidden, ids, w, gus, dns, cfg: MoeConfig, inner=10, reps=15) -> float:
    return graph_time_us(rotating(lambda i: fused_moe(hidden, ids, w, gus[i], dns[i], config=cfg)),
                         inner=inner, reps=reps)


def time_up(hidden, ids, w, gus, d: DecodeConfig) -> float:
    """moe_up alone (the align + gate/up GEMM launch)."""
    E, two_i, H = gus[0].shape
    d = resolve_decode(d, hidden.shape[0], H, two_i // 2, hidden.device)
    act = torch.empty(ids.numel(), gus[0].shape[1] // 2, dtype=hidden.dtype, device=hidden.device)
    return graph_time_us(rotating(lambda i: moe_up(
        hidden, ids, w, gus[i], act, block_m=d.block_m, block_n=d.up_n, block_k=d.up_k,
        num_warps=d.up_warps, num_stages=d.up_stages, programs_per_sm=d.programs_per_sm,
        flatten=d.flatten)))


def time_sglang(sgl, hidden, ids, w, gus, dns, scfg, aligned) -> float:
    """SGLang's layer: with its own align inside the timed region (aligned None), else after a
    precomputed align (where SGLang's align is a CUDA kernel that is not loadable here)."""
    if aligned is None:
        return graph_time_us(rotating(lambda i: sgl.layer(hidden, gus[i], dns[i], w, ids, scfg)))
    return graph_time_us(rotating(lambda i: sgl.forward(hidden, gus[i], dns[i], w, ids, scfg,
                                                        aligned)))


def tune(hidden, cases, gus, dns) -> dict[str, str]:
    """Best candidate per case (dense / base) by graph-replay time; cases: name -> (ids, w)."""
    best = {}
    for case, (ids, w) in cases.items():
        times = {}
        for name, d in CANDIDATES.items():
            if d.block_m and d.block_m >= 2 * max(16, hidden.shape[0]):
                continue
            times[name] = time_ours(hidden, ids, w, gus, dns, MoeConfig(decode=d), inner=5, reps=7)
        best[case] = min(times, key=times.get)
        print(f"  tune T={hidden.shape[0]} {case}: " + " ".join(f"{k}={v:.1f}" for k, v in
                                                             times.items()), flush=True)
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default=TOKENS)
    ap.add_argument("--sglang-root", default="", help="unpacked sglang 0.5.23 wheel (optional)")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=0.0)
    args = ap.parse_args()
    t_start = time.time()
    late = lambda: args.deadline_s > 0 and time.time() - t_start > args.deadline_s  # noqa: E731
    tokens = [int(x) for x in args.tokens.split(",")]
    sgl = None
    if args.sglang_root:
        try:
            from sglang_triton_moe import SglangMoe

            sgl = SglangMoe(args.sglang_root)
        except Exception:
            traceback.print_exc()
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s (read + write)", flush=True)
    rows: list[dict] = []
    configs: dict = {name: dataclasses.asdict(d) for name, d in CANDIDATES.items()}
    chosen: dict = {}
    meta = provenance({"tokens": tokens, "copies": COPIES, "skew": "N(0,1) per-expert logit bias",
                       "timing": "CUDA graph of 10 calls, median of 15 replays",
                       "copy_bw_gbs": bw, "sglang": bool(sgl), "tune_t": list(TUNE_T)})
    out_csv = os.path.join(args.out, "fused_moe.csv")
    hdr = (f"{'shape':14} {'T':>3} {'M':>6} {'read':>4} {'floor':>7} {'ours':>7} {'x floor':>7} "
           f"{'up':>6} {'sglang':>7} {'align':>5} {'ours/sgl':>8}")
    print(hdr, flush=True)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        expert_bytes = 3 * H * I * 2  # gate, up, down in bf16
        weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
        gus, dns = [g for g, _ in weights], [d for _, d in weights]
        g = torch.Generator().manual_seed(7)
        pred = Predictor(meta=PredictorMeta("synthetic", "synthetic", 1, [0], H, E, K),
                         weight=torch.randn(1, E, H, generator=g) * 0.02,
                         bias=torch.randn(1, E, generator=g) * 0.1).to(DEVICE)
        budgets = budgets_for(E, K)
        m_mid = budgets[len(budgets) // 2]
        winners: dict[int, dict[str, str]] = {}
        for T in tokens:
            if late():
                print(f"deadline: skipping {shape} T={T}", flush=True)
                continue
            try:
                r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
                hidden = torch.randn(T, H, device=DEVICE).bfloat16()
                union = int(torch.unique(r.ids).numel())
                sel = {}
                for M in budgets + [E]:
                    out = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                              torch.full((T,), M, device=DEVICE), 0,
                                              SelectionConfig(policy="base"), pred,
                                              norm_topk_prob=s["norm_topk_prob"])
                    sel[M] = (out.ids, out.weights)
                if T in TUNE_T and not args.no_tune and not late():
                    winners[T] = tune(hidden, {"dense": sel[E], "base": sel[m_mid]}, gus, dns)
                near = min(winners, key=lambda t: abs(t - T)) if winners else None
                scfg = sgl.config(T, E, H, I, K) if sgl else None
                for M, (ids, w) in sel.items():
                    dense = M >= E
                    name = winners[near]["dense" if dense else "base"] if near else "default"
                    cfg = MoeConfig(decode=CANDIDATES[name])
                    chosen[f"{shape}/T={T}/{'dense' if dense else 'base'}"] = name
                    n_read = int(torch.unique(ids[ids >= 0]).numel())
                    floor_us = n_read * expert_bytes / (bw * 1e9) * 1e6  # bytes read at the copy rate
                    ours = time_ours(hidden, ids, w, gus, dns, cfg)
                    up_us = time_up(hidden, ids, w, gus, cfg.decode)
                    row = dict(shape=shape, T=T, M="dense" if dense else M, union=union,
                               experts_read=n_read, floor_us=round(floor_us, 2),
                               ours_us=round(ours, 2), ours_over_floor=round(ours / floor_us, 3),
                               ours_gbs=round(n_read * expert_bytes / ours / 1e3, 1),
                               up_us=round(up_us, 2), pdl=True, config=name)
                    if sgl:
                        inside = sgl.align_is_sglangs(ids, E)
                        aligned = sgl.align(ids, E, scfg["BLOCK_SIZE_M"])
                        y_s = sgl.forward(hidden, gus[0], dns[0], w, ids, scfg, aligned)
                        y_o = fused_moe(hidden, ids, w, gus[0], dns[0], config=cfg)
                        diff = ((y_s.float() - y_o.float()).norm() / y_o.float().norm()).item()
                        t_s = time_sglang(sgl, hidden, ids, w, gus, dns, scfg,
                                          None if inside else aligned)
                        row.update(sglang_us=round(t_s, 2), sglang_align="in" if inside else "out",
                                   ours_over_sglang=round(ours / t_s, 3),
                                   rel_diff_vs_sglang=f"{diff:.1e}", sglang_config=scfg["_source"])
                    rows.append(row)
                    print(f"{shape:14} {T:>3} {row['M']!s:>6} {n_read:>4} {floor_us:>7.1f} {ours:>7.1f} "
                          f"{ours / floor_us:>7.2f} {up_us:>6.1f} {row.get('sglang_us', float('nan')):>7.1f} "
                          f"{row.get('sglang_align', '-'):>5} {row.get('ours_over_sglang', float('nan')):>8.2f}",
                          flush=True)
                write_rows(out_csv, rows, {**meta, "configs": configs, "chosen": chosen})
            except Exception:
                traceback.print_exc()
        weights = gus = dns = None  # free before the next shape
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    write_rows(out_csv, rows, {**meta, "configs": configs, "chosen": chosen})
    return 0


if __name__ == "__main__":
    sys.exit(main())
