"""MoE layer latency on the GPU: dense vs BASE(M), next to the byte floor and SGLang's Triton fused MoE.

    python benchmarks/bench_fused_moe.py --out benchmarks/results [--sglang-root /tmp/sglang_whl]
For each shape (kernel_common.SHAPES), decode batch T and budget M: BASE selection (Triton) picks the
executed ids from skewed synthetic routing (kernel_common.make_routing); then
  ours_us    base_sglang.kernels.fused_moe (align + 2 GEMMs + combine; pair-major without the align
             at T = 1): a coordinate search in this run (BLOCK_M, tiles, grid order; one config for
             dense, one for BASE at the middle budget), or with --no-tune the shipped default_config
  sglang_us  SGLang 0.5.23's Triton MoE (sglang_triton_moe.py: its tuned H200 config, align excluded)
  sglang_align_us  the same with SGLang's align inside the timed region, where SGLang runs a Triton
             align (T*K <= 64 and E + 1 > 64 buckets: its single-CTA kernel on torch.empty buffers,
             as moe_align_block_size does); elsewhere SGLang's align is a CUDA JIT kernel that does
             not load here, and the column is empty. Ours always includes our align.
  sglang_cuda_align_us  with --sgl-kernel-site (a site dir holding sgl_kernel, e.g. the device
             bundle's /tmp/sgl-bundle/site): SGLang with sgl_kernel's CUDA moe_align_block_size
             inside its time, at every T, as SGLang 0.5.17 runs it (rel_diff_cuda_align: its output
             against the align-outside run)
  floor_us   experts read x bytes per expert / device copy bandwidth measured in this run
             (eager D2D copy, bytes read + written per second)
Times: median of CUDA-graph replays of 10 calls, rotating over 3 copies of the weights so consecutive
calls never hit L2. Writes fused_moe.csv/.json under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
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

from base_sglang.core import SelectionConfig  # noqa: E402
from base_sglang.kernels import base_select_experts, fused_moe  # noqa: E402
from base_sglang.kernels.fused_moe import MoeConfig, default_config, device_name  # noqa: E402
from base_sglang.kernels.moe_gemm import GemmConfig  # noqa: E402
from base_sglang.testing.predictors import random_predictor  # noqa: E402

COPIES = 3
BM_CANDIDATES = (16, 32, 64)
UP_CANDIDATES = [GemmConfig(32, 128, 4, 4), GemmConfig(64, 128, 4, 3), GemmConfig(16, 256, 4, 3),
                 GemmConfig(32, 64, 4, 5), GemmConfig(64, 128, 4, 2)]
DOWN_CANDIDATES = [GemmConfig(64, 128, 4, 4), GemmConfig(32, 128, 4, 4), GemmConfig(128, 128, 4, 3),
                   GemmConfig(64, 64, 4, 5), GemmConfig(128, 128, 4, 2)]


def budgets_for(E: int, K: int) -> list[int]:
    ms = [m for m in (8, 10, 12, 16, 24, 32) if m < E]
    return ms or [m for m in (K, K + 2, E - 2) if 0 < m < E]  # Mixtral-like E=8: M in {2, 4, 6}


def rotating(fn_i):
    state = [0]

    def fn():
        i = state[0] % COPIES
        state[0] += 1
        return fn_i(i)
    return fn


def set_pdl(on: bool) -> None:
    os.environ["BASE_PDL"] = "1" if on else "0"


def tune(hidden, ids, w, gus, dns, base: MoeConfig) -> tuple[MoeConfig, bool]:
    """Coordinate search by graph-replay time: BLOCK_M, then up, then down, then grid order."""
    def t(cfg, pdl=True):
        set_pdl(pdl)
        return graph_time_us(rotating(lambda i: fused_moe(hidden, ids, w, gus[i], dns[i], config=cfg)),
                             inner=5, reps=7)
    kept = ids[ids >= 0]
    max_count = int(torch.bincount(kept.long()).max()) if kept.numel() else 1
    bms = [bm for bm in BM_CANDIDATES if bm == 16 or bm <= 2 * max_count]
    best = min((dataclasses.replace(base, block_m=bm) for bm in bms), key=t)
    best = min((dataclasses.replace(best, up=u) for u in UP_CANDIDATES), key=t)
    best = min((dataclasses.replace(best, down=d) for d in DOWN_CANDIDATES), key=t)
    flipped = dataclasses.replace(best, up=dataclasses.replace(best.up, n_fast=True),
                                  down=dataclasses.replace(best.down, n_fast=True))
    return min((best, flipped), key=t), True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels_h200")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tokens", default="1,8,16,32,64,128")
    ap.add_argument("--sglang-root", default="", help="unpacked sglang 0.5.23 wheel (optional)")
    ap.add_argument("--sgl-kernel-site", default="",
                    help="a site dir with sgl_kernel (the device bundle's): also time SGLang with "
                         "its CUDA align inside (sglang_cuda_align_us)")
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--dense-only", action="store_true", help="time the dense routing alone (no BASE M)")
    args = ap.parse_args()
    tokens = [int(x) for x in args.tokens.split(",")]
    sgl = None
    if args.sglang_root:
        try:
            from sglang_triton_moe import SglangMoe

            sgl = SglangMoe(args.sglang_root, args.sgl_kernel_site)
        except Exception:
            traceback.print_exc()
    bw = copy_bandwidth_gbs()
    print(f"copy bandwidth {bw:.0f} GB/s (read + write)", flush=True)
    rows: list[dict] = []
    configs: dict = {}
    meta = provenance({"tokens": tokens, "copies": COPIES, "skew": "N(0,1) per-expert logit bias",
                       "timing": "CUDA graph of 10 calls, median of 15 replays",
                       "copy_bw_gbs": bw, "sglang": bool(sgl)})
    out_csv = os.path.join(args.out, "fused_moe.csv")
    hdr = f"{'shape':14} {'T':>4} {'M':>6} {'read':>4} {'floor':>8} {'ours':>8} {'x floor':>7} {'sglang':>8} {'ours/sgl':>8} {'sgl+aln':>8}"
    print(hdr, flush=True)
    for shape in args.shapes.split(","):
        s = SHAPES[shape]
        E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
        expert_bytes = 3 * H * I * 2  # gate, up, down in bf16
        weights = [make_experts(E, H, I, seed=c) for c in range(COPIES)]
        gus, dns = [g for g, _ in weights], [d for _, d in weights]
        pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                                architecture="synthetic").to(DEVICE)
        for T in tokens:
            try:
                r = make_routing(T, E, K, s["norm_topk_prob"], seed=T)
                hidden = torch.randn(T, H, device=DEVICE).bfloat16()
                union = int(torch.unique(r.ids).numel())
                sel = {}
                for M in ([] if args.dense_only else budgets_for(E, K)) + [E]:
                    out = base_select_experts(r.logits, r.ids, r.weights, hidden,
                                              torch.full((T,), M, device=DEVICE), 0,
                                              SelectionConfig(policy="base"), pred,
                                              norm_topk_prob=s["norm_topk_prob"])
                    sel[M] = (out.ids, out.weights)
                m_mid = budgets_for(E, K)[len(budgets_for(E, K)) // 2]
                gpu = device_name(torch.device(DEVICE))  # the shipped default: tuned rows of this GPU
                cfg_dense = default_config(T, E, K, hidden=H, inter=I, gpu=gpu)
                cfg_base = default_config(T, E, K, m_mid, hidden=H, inter=I, gpu=gpu)
                pdl_dense = pdl_base = True
                if not args.no_tune:
                    cfg_dense, pdl_dense = tune(hidden, r.ids, r.weights, gus, dns, cfg_dense)
                    if m_mid in sel:  # (not with --dense-only)
                        cfg_base, pdl_base = tune(hidden, *sel[m_mid], gus, dns, cfg_base)
                configs[f"{shape}/T={T}"] = {
                    "dense": {**dataclasses.asdict(cfg_dense), "pdl": pdl_dense},
                    f"base(M={m_mid})": {**dataclasses.asdict(cfg_base), "pdl": pdl_base}}
                scfg = sgl.config(T, E, H, I, K) if sgl else None
                for M, (ids, w) in sel.items():
                    dense = M >= E
                    cfg = cfg_dense if dense else cfg_base
                    set_pdl(pdl_dense if dense else pdl_base)
                    n_read = int(torch.unique(ids[ids >= 0]).numel())
                    floor_us = n_read * expert_bytes / (bw * 1e9) * 1e6  # bytes read at the copy rate
                    ours = graph_time_us(rotating(
                        lambda i, x=hidden, ids=ids, w=w, cfg=cfg, gu=gus, dn=dns: fused_moe(x, ids, w, gu[i], dn[i], config=cfg)))
                    row = dict(shape=shape, T=T, M="dense" if dense else M, union=union,
                               experts_read=n_read, floor_us=round(floor_us, 2),
                               ours_us=round(ours, 2), ours_over_floor=round(ours / floor_us, 3),
                               ours_gbs=round(n_read * expert_bytes / ours / 1e3, 1),
                               pdl=pdl_dense if dense else pdl_base)
                    set_pdl(True)
                    if sgl:
                        aligned = sgl.align(ids, E, scfg["BLOCK_SIZE_M"])
                        y_s = sgl.forward(hidden, gus[0], dns[0], w, ids, scfg, aligned)
                        y_o = fused_moe(hidden, ids, w, gus[0], dns[0], config=cfg)
                        diff = ((y_s.float() - y_o.float()).norm() / y_o.float().norm()).item()
                        t_s = graph_time_us(rotating(
                            lambda i, x=hidden, ids=ids, w=w, al=aligned, c=scfg, gu=gus, dn=dns: sgl.forward(x, gu[i], dn[i], w, ids, c, al)))
                        row.update(sglang_us=round(t_s, 2), ours_over_sglang=round(ours / t_s, 3),
                                   rel_diff_vs_sglang=f"{diff:.1e}", sglang_config=scfg["_source"])
                        bm = scfg["BLOCK_SIZE_M"]
                        if sgl.align_as_sglang(ids, E, bm) is not None:
                            t_sa = graph_time_us(rotating(
                                lambda i, x=hidden, ids=ids, w=w, c=scfg, gu=gus, dn=dns, E=E, bm=bm:
                                sgl.forward(x, gu[i], dn[i], w, ids, c,
                                            sgl.align_as_sglang(ids, E, bm))))
                            row.update(sglang_align_us=round(t_sa, 2),
                                       ours_over_sglang_align=round(ours / t_sa, 3))
                        if sgl.cuda_align is not None:  # SGLang's CUDA align inside its time
                            y_c = sgl.forward(hidden, gus[0], dns[0], w, ids, scfg,
                                              sgl.align_cuda(ids, E, bm))
                            t_ca = graph_time_us(rotating(
                                lambda i, x=hidden, ids=ids, w=w, c=scfg, gu=gus, dn=dns, E=E, bm=bm:
                                sgl.forward(x, gu[i], dn[i], w, ids, c, sgl.align_cuda(ids, E, bm))))
                            row.update(sglang_cuda_align_us=round(t_ca, 2),
                                       ours_over_sglang_cuda_align=round(ours / t_ca, 3),
                                       rel_diff_cuda_align=f"{((y_c.float() - y_s.float()).norm() / y_s.float().norm()).item():.1e}")
                    rows.append(row)
                    print(f"{shape:14} {T:>4} {row['M']!s:>6} {n_read:>4} {floor_us:>8.1f} {ours:>8.1f} "
                          f"{ours / floor_us:>7.2f} {row.get('sglang_us', float('nan')):>8.1f} "
                          f"{row.get('ours_over_sglang', float('nan')):>8.2f} "
                          f"{row.get('sglang_align_us', float('nan')):>8.1f}", flush=True)
                write_rows(out_csv, rows, {**meta, "configs": configs})
            except Exception:
                traceback.print_exc()
        weights = gus = dns = None  # free before the next shape
        torch.cuda.empty_cache()
    write_rows(out_csv, rows, {**meta, "configs": configs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
