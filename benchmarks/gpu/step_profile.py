"""Where one decode step's GPU time goes, and the HBM byte floor of each part.

    classify(kernel_name)   -> one of CATEGORIES (by the kernel names of SGLang 0.5.17's decode
                               path for Qwen3-MoE with the Triton attention and MoE backends)
    kernel_table(events)    -> per-category and per-kernel GPU time from torch.profiler events
    byte_floors(...)        -> bytes each category must move per step, and that time at HBM speed

Categories:
  moe_experts   expert GEMMs (fused_moe_kernel), moe_align, activation, moe_sum_reduce
  router        the top-k softmax kernel over the router logits (the router GEMM is in gemm)
  base_select   BASE's two Triton kernels (_base_score_kernel, _base_select_kernel)
  allreduce     tensor-parallel collectives: NCCL, SGLang's custom all-reduce (legacy
                cross_device_reduce_*, v2 all_reduce_kernel), all-gathers (0 with one GPU)
  attention     decode attention (both Triton stages), RoPE, KV-cache stores
  gemm          dense GEMMs: qkv/o projections, router logits, lm_head (cuBLAS/nvjet/cutlass)
  norm          RMSNorm (incl. fused add + norm, q/k norm)
  other         everything else (embedding, sampling, copies, elementwise)
The CPU side (Python, graph launch) is not in these sums: graph step time - GPU busy time shows it.
"""

from __future__ import annotations

import re

CATEGORIES = ("moe_experts", "router", "base_select", "allreduce", "attention", "gemm", "norm",
              "other")
H200_HBM_BYTES_S = 4.8e12  # H200 SXM peak HBM3e bandwidth (spec sheet), the floor's denominator

_RULES = (  # first match wins; names lower-cased
    ("base_select", r"_base_score_kernel|_base_select_kernel|base_score|base_select"),
    ("allreduce", r"nccl|cross_device_reduce|all_reduce|allreduce|reduce_scatter|all_gather"
                  r"|allgather"),
    ("router", r"topk_softmax|topkgating|moe_fused_gate|router_triton|fused_moe_router"
               r"|streaming_topk|gate_topk|grouped_topk"),
    ("moe_experts", r"fused_moe|moe_align|align_block|count_and_sort|moe_sum|act_and_mul"
                    r"|silu_and_mul|moe_combine|small_numel|moe_fused_mul_sum"),
    ("attention", r"fwd_kernel_stage|fwd_grouped_kernel|decode_att|flash|attention|rotary|rope"
                  r"|store_kv|kvcache|set_kv|kv_buffer"),
    ("norm", r"rmsnorm|layernorm|norm_kernel|fused_add_rms"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|sm90_|cublas|gemv|splitk|matmul"),
)
_COMPILED = tuple((cat, re.compile(rx)) for cat, rx in _RULES)


def classify(name: str) -> str:
    low = name.lower()
    for cat, rx in _COMPILED:
        if rx.search(low):
            return cat
    return "other"


def kernel_table(events, steps: int, top: int = 25) -> dict:
    """torch.profiler key_averages() entries of GPU kernels -> per-step ms by category + top kernels.

    events: iterable with .key, .device_time_total (us; older torch: .cuda_time_total), .count and
    .device_type (only CUDA entries are kernels)."""
    per_kernel = {}
    for ev in events:
        if "cuda" not in str(getattr(ev, "device_type", "")).lower():
            continue
        us = getattr(ev, "device_time_total", None)
        if us is None:
            us = getattr(ev, "cuda_time_total", 0.0)
        if not us:
            continue
        k = per_kernel.setdefault(ev.key, [0.0, 0])
        k[0] += us
        k[1] += ev.count
    cats = dict.fromkeys(CATEGORIES, 0.0)
    for name, (us, _) in per_kernel.items():
        cats[classify(name)] += us / 1000.0 / steps
    kernels = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    return {"gpu_ms_per_step": {c: round(v, 4) for c, v in cats.items()},
            "gpu_busy_ms_per_step": round(sum(cats.values()), 4),
            "top_kernels": [{"name": n[:160], "category": classify(n),
                             "ms_per_step": round(us / 1000.0 / steps, 4),
                             "launches_per_step": round(cnt / steps, 2)}
                            for n, (us, cnt) in kernels]}


def byte_floors(config: dict, batch: int, context_len: float, experts_per_layer: float,
                union: float, dtype_bytes: int = 2, predictor_layers: int | None = None,
                bandwidth: float = H200_HBM_BYTES_S, tp: int = 1) -> dict:
    """Bytes one decode step must read from HBM, per category (weights once per step, KV once).

    experts_per_layer: distinct experts executed per MoE layer (the union when dense, <= M with
    BASE); union is reported alongside. context_len: mean KV length per request in the step.
    tp: the bytes of ONE rank under SGLang's tensor parallelism: expert, projection and lm_head
    weights and the KV heads are split over the ranks; the router, the norms and BASE's
    selection are replicated (every rank reads them whole)."""
    h = config["hidden_size"]
    layers = config["num_hidden_layers"]
    num_e = config.get("num_experts") or config.get("num_local_experts")
    inter = config["moe_intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or h // heads
    vocab = config["vocab_size"]
    moe_layers = predictor_layers if predictor_layers is not None else layers
    if tp < 1:
        raise ValueError(f"tp: must be >= 1, got {tp}")
    expert_bytes = 3 * h * inter * dtype_bytes // tp  # gate + up [2I, H] and down [H, I], 1/tp each
    attn_proj = (h * (heads + 2 * kv_heads) * hd + heads * hd * h) * dtype_bytes // tp  # qkv + o
    kv_rank = max(1, kv_heads // tp)  # KV heads per rank (replicated when fewer than ranks)
    floors = {
        "moe_experts": experts_per_layer * expert_bytes * moe_layers,
        "attention": batch * context_len * layers * 2 * kv_rank * hd * dtype_bytes,  # K and V
        "gemm": layers * attn_proj + moe_layers * num_e * h * dtype_bytes
        + vocab * h * dtype_bytes // tp,
        # BASE reads each routed pair's predictor row a_u (fp32) once: [T, K, H]
        "base_select": batch * config["num_experts_per_tok"] * h * 4 * moe_layers,
        "norm": (2 * layers + 1) * h * dtype_bytes,
    }
    out = {cat: {"bytes": int(b), "floor_ms": round(b / bandwidth * 1000.0, 4)}
           for cat, b in floors.items()}
    total = sum(floors.values())
    return {"per_category": out, "total_bytes": int(total),
            "total_floor_ms": round(total / bandwidth * 1000.0, 4),
            "bandwidth_bytes_s": bandwidth, "experts_per_layer": experts_per_layer, "tp": tp,
            "union_dense": union, "dense_union_expert_bytes": int(union * expert_bytes * moe_layers),
            "bytes_per_expert_per_layer": expert_bytes, "context_len": context_len}
