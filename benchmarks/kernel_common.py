"""Shared setup for the kernel checks and benchmarks: shapes, synthetic routing, timing, provenance."""

from __future__ import annotations

import csv
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

# MoE layer shapes (H hidden, I expert intermediate, E experts, K top-k); bf16 weights
SHAPES = {
    "qwen3-30b-a3b": dict(H=2048, I=768, E=128, K=8, norm_topk_prob=True),
    "olmoe-1b-7b": dict(H=2048, I=1024, E=64, K=8, norm_topk_prob=False),
    "mixtral-8x7b": dict(H=4096, I=14336, E=8, K=2, norm_topk_prob=True),
}
# BASE_TINY=1: tiny stand-ins with the same E/K structure, to dry-run the scripts on the CPU
# interpreter (TRITON_INTERPRET=1) before spending device time
if os.environ.get("BASE_TINY"):
    SHAPES = {k: dict(v, H=32, I=16, E=min(v["E"], 12)) for k, v in SHAPES.items()}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# BASE_ROUTE_TILES = num_warps, rows per block, iterative top-k, D through the scratch row[, narrow
# backfill width: 0 off, default 32]; the candidates per T (fifth session: the scratch row cut the
# SASS of the Qwen3 T = 16 launch from 4016 to 3000 instructions at 8 warps and to ~2000 at 16, so
# more warps are tried; sixth: the narrow backfill timed against 0 and 16, and the router's top-k
# by K max-reductions at 8 warps, ~15 % fewer SASS on the path than the bitonic one at T = 16-64)
ROUTE_VARIANTS = {
    1: ["4,1,0,1", "4,1,0,0", "2,1,1,1", "1,1,1,1", "8,1,0,1", "1,1,1,1,0"],
    8: ["8,8,0,1", "8,8,0,0", "16,8,0,1", "16,8,1,1", "4,8,0,1", "4,8,0,1,0", "8,8,1,1"],
    16: ["8,16,0,1", "8,16,0,0", "16,16,0,1", "32,16,0,1", "16,16,1,1", "8,16,0,1,0", "8,16,0,1,16",
         "8,16,1,1"],
    32: ["8,16,0,1", "16,16,0,1", "16,32,0,1", "32,32,0,1", "8,16,0,1,0", "8,16,1,1"],
    64: ["8,16,0,1", "16,16,0,1", "32,32,0,1", "32,64,0,1", "8,16,0,1,0", "8,16,1,1"],
}

# base_route_split's BASE_ROUTE_SPLIT_TILES = rows per program, warps of launch 1, of launch 2
# [, iterative top-k[, narrow backfill width]]; the default (split_blocks) is timed as well
SPLIT_VARIANTS = ["4,4,4,0,0", "2,4,4,0,0", "4,2,2,0,0", "4,8,8,0,0", "8,4,4,0,0", "2,2,2,0,0",
                  "4,4,4,0,32"]

SKEW = 1.0  # router logits = N(0, 1) per (token, expert) + a fixed per-expert N(0, SKEW^2) bias


@dataclass
class FoldedLayer:
    """A synthetic folded MoE layer of one shape for the route-select benchmarks."""
    E: int
    K: int
    H: int
    norm: bool  # norm_topk_prob
    pred: object  # core.Predictor, random, on DEVICE
    router: torch.Tensor  # [E, H] bf16, random
    w2: torch.Tensor  # [2E, H] the router's rows with the predictor's stacked under them
    b: torch.Tensor  # [E] the predictor's bias
    comb: dict  # combine rule of the config: base_route_select's combine= and alpha=


def folded_layer(shape: str, cfg) -> FoldedLayer:
    from base_sglang.core.routing import fold_router
    from base_sglang.testing.predictors import random_predictor

    s = SHAPES[shape]
    E, K, H, norm = s["E"], s["K"], s["H"], s["norm_topk_prob"]
    pred = random_predictor(E, H, K, seed=7, scale=0.02, bias_scale=0.1,
                            architecture="synthetic").to(DEVICE)
    router = (torch.randn(E, H, device=DEVICE) * H ** -0.5).bfloat16()
    return FoldedLayer(E, K, H, norm, pred, router, fold_router(router, pred, 0), pred.bias[0],
                       dict(combine=cfg.combine_mode(norm), alpha=cfg.renorm_alpha))


@dataclass
class Routing:
    logits: torch.Tensor  # [T, E] fp32
    ids: torch.Tensor  # [T, K] int32
    weights: torch.Tensor  # [T, K] fp32


def make_routing(T: int, E: int, K: int, norm_topk_prob: bool, seed: int = 0,
                 device: str = DEVICE) -> Routing:
    """Synthetic skewed routing: softmax top-k of N(0,1) logits plus a fixed per-expert bias."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    bias = torch.randn(E, generator=g) * SKEW  # [E] popularity skew, fixed per shape
    logits = (torch.randn(T, E, generator=g) + bias).to(device)  # [T, E]
    p = torch.softmax(logits, -1)
    w, ids = p.topk(K, -1)  # [T, K]
    if norm_topk_prob:
        w = w / w.sum(-1, keepdim=True)
    return Routing(logits, ids.int().contiguous(), w.contiguous())


def make_experts(E: int, H: int, I: int, seed: int = 0, device: str = DEVICE):  # noqa: E741
    """Random bf16 expert weights in transformers 5 layout: gate_up [E, 2I, H], down [E, H, I]."""
    g = torch.Generator(device=device).manual_seed(seed)
    gate_up = (torch.randn(E, 2 * I, H, generator=g, device=device) * H ** -0.5).bfloat16()
    down = (torch.randn(E, H, I, generator=g, device=device) * I ** -0.5).bfloat16()
    return gate_up, down


def capture_graph(fn, inner: int = 10) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `inner` fn() calls, warmed up and captured on a side stream, as SGLang does."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_time_us(g: torch.cuda.CUDAGraph, inner: int, reps: int = 15) -> float:
    """Median over `reps` replays of g's time per captured call, in microseconds (CUDA events)."""
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(times)


def graph_time_us(fn, inner: int = 10, reps: int = 15) -> float:
    """Median time of one fn() call in microseconds, replaying a CUDA graph of `inner` calls."""
    if DEVICE == "cpu":  # dry run only: wall clock of one call
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6
    g = capture_graph(fn, inner)
    us = replay_time_us(g, inner, reps)
    del g
    return us


def copy_bandwidth_gbs(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth, (bytes read + bytes written) / time, GB/s.

    Eager copy_ (an SM copy kernel), timed with events, median of 10. NOTE: inside a CUDA graph the
    same copy becomes a memcpy node on the copy engines and measured only ~2.7 TB/s on the H200, so
    it is not used for the floor.
    """
    if DEVICE == "cpu":
        nbytes = 1 << 20
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).normal_()
    dst = torch.empty_like(src)
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        dst.copy_(src)
        return 2 * nbytes / (time.perf_counter() - t0) / 1e9
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * nbytes / statistics.median(times) / 1e9


def provenance(settings: dict) -> dict:
    import triton

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "commit": os.environ.get("BASE_COMMIT", "unknown"),
        "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "settings": settings,
    }


def write_rows(path: str, rows: list[dict], meta: dict) -> None:
    """CSV (one row per measurement, provenance columns appended) + a JSON sidecar with the meta."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if rows:
        cols = list(rows[0]) + ["gpu", "commit"]
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols)
            w.writeheader()
            for r in rows:
                w.writerow({**r, "gpu": meta["gpu"], "commit": meta["commit"]})
    with open(os.path.splitext(path)[0] + ".json", "w") as f:
        json.dump({**meta, "rows": rows}, f, indent=1)
