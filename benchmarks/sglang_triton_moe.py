"""SGLang 0.5.23's own Triton fused MoE, loaded at run time from the unpacked wheel (never vendored).

What is loaded, unmodified, from <root>/sglang/...:
  kernels/ops/moe/fused_moe_triton_kernels.py             fused_moe_kernel + invoke_fused_moe_kernel,
                                                            act_and_mul_triton, moe_sum_reduce_triton
  kernels/ops/moe/moe_align_small_numel.py                 the single-CTA Triton align kernel
  srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py   tuned-config lookup (+ JSONs)
Their import chain (sglang.srt.utils, sgl_kernel, ...) is far too heavy for a bare GPU box, so before
exec'ing those files this module registers minimal stand-ins for the few names they import, each
returning what SGLang itself returns on an H200 with default settings: is_cuda/is_sm90 True, hip/cpu/
aiter False, batch-invariant mode off, MoE padding 0, deterministic inference off, PDL on sm90+.
The fp8/int8 quantisation helpers are only reached on quantised paths and raise if called.

`SglangMoe.forward` mirrors fused_experts_impl's bf16 path (`_fused_moe_kernel_sequence`): up GEMM
(fused_moe_kernel), SiLU*mul (their Triton act_and_mul_triton with the -1 row filter; on CUDA SGLang
calls sgl_kernel's CUDA silu_and_mul), down GEMM with routed weights, and moe_sum_reduce_triton (on
CUDA SGLang uses sgl_kernel's moe_sum_reduce). The align runs outside `forward` (SGLang runs a CUDA
align kernel there), so SGLang's timed layer excludes the align while ours includes it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

import torch


def _module(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    return mod


def _unavailable(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"{name}: quantised paths are not loaded in this benchmark")
    return fn


def _load(name: str, path: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_sglang_moe(root: str):
    """Return (kernels module, align module, config module) from an unpacked sglang wheel at root."""
    for pkg in ("sglang", "sglang.kernels", "sglang.kernels.ops", "sglang.kernels.ops.moe",
                "sglang.kernels.ops.quantization", "sglang.kernels.jit", "sglang.srt",
                "sglang.srt.layers", "sglang.srt.layers.moe", "sglang.srt.layers.moe.moe_runner",
                "sglang.srt.layers.moe.moe_runner.triton_utils"):
        _module(pkg, __path__=[])
    major = torch.cuda.get_device_capability()[0] if torch.cuda.is_available() else 0
    _module("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: major >= 9)
    _module("sglang.kernels.ops.quantization.fp8_kernel", **{
        n: _unavailable(n) for n in ("per_token_group_quant_fp8", "scaled_fp8_quant",
                                     "sglang_per_token_group_quant_fp8")})
    _module("sglang.kernels.ops.quantization.int8_kernel", **{
        n: _unavailable(n) for n in ("per_token_group_quant_int8", "per_token_quant_int8",
                                     "sglang_per_token_group_quant_int8")})
    _module("sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False)
    flag = types.SimpleNamespace(get=lambda: False)
    _module("sglang.srt.environ", envs=types.SimpleNamespace(SGLANG_USE_AITER=flag))
    _module("sglang.srt.layers.moe.utils", get_moe_padding_size=lambda is_aiter: 0)
    _module("sglang.srt.utils", cpu_has_amx_support=lambda: False, is_cpu=lambda: False,
            is_cuda=lambda: True, is_hip=lambda: False, is_sm90_supported=lambda: major >= 9,
            get_device_name=lambda device_id=0: torch.cuda.get_device_name(device_id))
    exec_ctx = types.SimpleNamespace(
        deterministic=types.SimpleNamespace(enable_deterministic_inference=False))
    _module("sglang.srt.runtime_context", get_exec=lambda: exec_ctx)
    base = os.path.join(root, "sglang")
    kern = _load("sglang.kernels.ops.moe.fused_moe_triton_kernels",
                 os.path.join(base, "kernels/ops/moe/fused_moe_triton_kernels.py"))
    align = _load("sglang.kernels.ops.moe.moe_align_small_numel",
                  os.path.join(base, "kernels/ops/moe/moe_align_small_numel.py"))
    cfg = _load("sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config",
                os.path.join(base, "srt/layers/moe/moe_runner/triton_utils/fused_moe_triton_config.py"))
    return kern, align, cfg


def load_cuda_align(site: str):
    """sgl_kernel.moe_align_block_size (SGLang's CUDA align) from a site dir holding sgl_kernel (the
    device bundle's /tmp/sgl-bundle/site), or None when it does not import. Call before
    load_sglang_moe (whose stand-ins must not take sgl_kernel's name first)."""
    if not site:
        return None
    sys.path.insert(0, site)
    try:
        from sgl_kernel import moe_align_block_size

        return moe_align_block_size
    except Exception as exc:  # noqa: BLE001 - any import failure means: not timed
        print(f"sgl_kernel from {site} not loadable: {exc!r}", flush=True)
        return None
    finally:
        sys.path.remove(site)


class SglangMoe:
    """SGLang's bf16 Triton MoE path for fixed (E, I, K) weights, as fused_experts_impl runs it."""

    def __init__(self, root: str, sgl_kernel_site: str = ""):
        self.cuda_align = load_cuda_align(sgl_kernel_site)
        self.kern, self.align_mod, self.cfg_mod = load_sglang_moe(root)

    def align_cuda(self, topk_ids: torch.Tensor, E: int, block_m: int):
        """SGLang 0.5.17's moe_align_block_size on CUDA, as it calls sgl_kernel: torch.empty
        buffers, E + 1 buckets, pad_sorted_token_ids=True; None without sgl_kernel."""
        if self.cuda_align is None:
            return None
        numel = topk_ids.numel()
        max_pad = numel * block_m if numel < E + 1 else numel + (E + 1) * (block_m - 1)
        dev = topk_ids.device
        sorted_ids = torch.empty((max_pad,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-max_pad // block_m),), dtype=torch.int32, device=dev)
        ntpp = torch.empty((1,), dtype=torch.int32, device=dev)
        cumsum = torch.empty((E + 2,), dtype=torch.int32, device=dev)
        self.cuda_align(topk_ids, E + 1, block_m, sorted_ids, expert_ids, ntpp, cumsum, True, False)
        return sorted_ids, expert_ids, ntpp

    def config(self, num_tokens: int, E: int, H: int, I: int, K: int) -> dict:  # noqa: E741
        """The config SGLang picks: its tuned JSON for (E, N=I, device) at the nearest M, else default."""
        configs = self.cfg_mod.get_moe_configs(E, I, None, 0, 0, False, False)
        if configs:
            cfg = configs[min(configs.keys(), key=lambda m: abs(m - num_tokens))]
            source = "tuned"
        else:
            cfg = self.cfg_mod.get_default_config(num_tokens, E, I, H, K, None, False, None)
            source = "default"
        cfg = {k: v for k, v in dict(cfg).items() if k != "USE_TMA"}
        return {**cfg, "_source": source}

    def align(self, topk_ids: torch.Tensor, E: int, block_m: int):
        """moe_align_block_size's outputs (E + 1 buckets, id -1 -> bucket 0, blocks of expert -1).

        numel <= 64: their single-CTA Triton kernel (what SGLang runs there); larger: the same contract
        in torch (SGLang runs a CUDA kernel from sgl_kernel there, which is not loadable here).
        """
        numel = topk_ids.numel()
        if numel < E + 1:
            max_pad = numel * block_m
        else:
            max_pad = numel + (E + 1) * (block_m - 1)
        max_pad = (max_pad + 3) // 4 * 4
        dev = topk_ids.device
        sorted_ids = torch.full((max_pad,), numel, dtype=torch.int32, device=dev)
        expert_ids = torch.full((-(-max_pad // block_m),), -1, dtype=torch.int32, device=dev)
        ntpp = torch.empty(1, dtype=torch.int32, device=dev)
        if numel <= 64:
            self.align_mod.moe_align_small_numel(topk_ids, E + 1, block_m, sorted_ids, expert_ids,
                                                 ntpp)
            return sorted_ids, expert_ids, ntpp
        bucket = topk_ids.flatten().long() + 1  # [numel] 0 = dropped
        counts = torch.bincount(bucket, minlength=E + 1)  # [E+1]
        padded = (counts + block_m - 1) // block_m * block_m
        start = torch.cumsum(padded, 0) - padded  # [E+1] first row of each bucket
        order = torch.argsort(bucket, stable=True)  # [numel]
        b_sorted = bucket[order]
        first = torch.cumsum(counts, 0) - counts
        pos = start[b_sorted] + torch.arange(numel, device=dev) - first[b_sorted]
        sorted_ids[pos] = order.int()
        block_start = torch.arange(expert_ids.numel(), device=dev) * block_m
        owner = torch.searchsorted(torch.cumsum(padded, 0), block_start, right=True)  # bucket
        expert_ids.copy_(torch.where(owner <= E, owner - 1, -1).int())
        ntpp.fill_(int(padded.sum()))
        return sorted_ids, expert_ids, ntpp

    def align_as_sglang(self, topk_ids: torch.Tensor, E: int, block_m: int):
        """What SGLang's moe_align_block_size runs where it runs Triton (numel <= 64 and E + 1 > 64
        buckets): torch.empty buffers and its single-CTA kernel; None elsewhere (a CUDA kernel)."""
        numel = topk_ids.numel()
        if numel > 64 or E + 1 <= 64:
            return None
        max_pad = (numel * block_m + 3) // 4 * 4 if numel < E + 1 else \
            (numel + (E + 1) * (block_m - 1) + 3) // 4 * 4
        dev = topk_ids.device
        sorted_ids = torch.empty((max_pad,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty((-(-max_pad // block_m),), dtype=torch.int32, device=dev)
        ntpp = torch.empty(1, dtype=torch.int32, device=dev)
        self.align_mod.moe_align_small_numel(topk_ids, E + 1, block_m, sorted_ids, expert_ids, ntpp)
        return sorted_ids, expert_ids, ntpp

    def forward(self, x, w1, w2, topk_w, topk_ids, config, aligned) -> torch.Tensor:
        import triton.language as tl

        sorted_ids, expert_ids, ntpp = aligned
        T, K = topk_ids.shape
        E, N, _ = w1.shape
        cfg = {k: v for k, v in config.items() if not k.startswith("_")}
        common = dict(compute_type=tl.bfloat16 if x.dtype == torch.bfloat16 else tl.float16, use_fp8_w8a8=False, use_int8_w8a8=False,
                      use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                      block_shape=None)
        cache1 = torch.empty((T * K, N), device=x.device, dtype=x.dtype)
        self.kern.invoke_fused_moe_kernel(x, w1, None, cache1, None, None, None, topk_w, topk_ids,
                                          sorted_ids, expert_ids, ntpp, False, K, cfg, **common)
        cache2 = torch.empty((T * K, N // 2), device=x.device, dtype=x.dtype)
        self.kern.act_and_mul_triton(cache1, cache2, cfg, topk_ids)
        cache3 = torch.empty((T, K, w2.shape[1]), device=x.device, dtype=x.dtype)
        self.kern.invoke_fused_moe_kernel(cache2, w2, None, cache3, None, None, None, topk_w,
                                          topk_ids, sorted_ids, expert_ids, ntpp, True, 1, cfg,
                                          router_topk=K, **common)
        out = torch.empty((T, w2.shape[1]), device=x.device, dtype=x.dtype)
        self.kern.moe_sum_reduce_triton(cache3, out, 1.0)
        return out
