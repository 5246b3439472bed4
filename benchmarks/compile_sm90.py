"""Compile the Triton kernels for the H200 (sm_90a) WITHOUT a GPU and report their resources.

    python benchmarks/compile_sm90.py [--all-configs] [--strict]
Each kernel is compiled the way a launch specialises it (pointers and ints divisible by 16 carry the
hint, ints equal to 1 become constants), at the real shapes and every T bucket the device run uses;
the cubin's resource usage (cuobjdump from Triton's wheel) and the TTGIR give, per variant:
registers, stack (local memory: spills), shared memory, and the count of cp.async copies (0 means
the loads are not software-pipelined). --strict: exit 1 if a default-config variant uses local
memory or a GEMM loop is not pipelined. Needs only triton (its bundled ptxas/cuobjdump).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_moe import CANDIDATES  # noqa: E402

from base_sglang.kernels.base_select import _base_select_kernel, select_blocks  # noqa: E402
from base_sglang.kernels.fused_moe import DecodeConfig, resolve_decode  # noqa: E402
from base_sglang.kernels.moe_down import _moe_down_kernel  # noqa: E402
from base_sglang.kernels.moe_up import _moe_up_kernel  # noqa: E402

SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "olmoe-1b-7b": (2048, 1024, 64, 8),
          "mixtral-8x7b": (4096, 14336, 8, 2)}  # H, I, E, K
TOKENS = (1, 2, 16, 32, 64)  # every BLOCK_T bucket, plus T=1 (specialised) and T=2 (no /16 hint)
NUM_SMS = 132
L2_BYTES = 60 << 20  # H200
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")


def compile90(fn, sig: dict, consts: dict, ints: dict, num_warps: int, num_stages: int) -> dict:
    consts = dict(consts)
    consts.update({k: 1 for k, v in ints.items() if v == 1})
    full = {n: ("constexpr" if n in consts else sig[n]) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if full[n].startswith("*") or (n in ints and n not in consts and ints[n] % 16 == 0)}
    ck = triton.compile(ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return dict(regs=int(m.group(1)), stack=int(m.group(2)), smem=ck.metadata.shared,
                async_copies=ck.asm["ttgir"].count("async_copy_global_to_local"))


def select_variant(T, H, E, K, backfill=True, renorm=True):
    cfg = select_blocks(T, E, K, H)
    nw = cfg.pop("num_warps")
    sig = {n: "*i32" for n in ("ids_ptr", "out_ids_ptr", "union_ptr", "ticket_ptr")}
    sig.update(hidden_ptr="*bf16", w_ptr="*fp32", logits_ptr="*fp32", budget_ptr="*i64",
               a_ptr="*fp32", b_ptr="*fp32", out_w_ptr="*fp32", d_ptr="*fp32", in_s_ptr="*i8",
               counts_ptr="*i64", removed_ptr="*fp32", T="i32", H="i32", stride_ht="i32",
               stride_lt="i32", stride_ae="i32")
    consts = dict(E=E, K=K, **cfg, BACKFILL=backfill, RENORM=renorm, USE_PDL=True)
    ints = dict(T=T, H=H, stride_ht=H, stride_lt=E, stride_ae=H)
    return compile90(_base_select_kernel, sig, consts, ints, nw, 3)


def moe_variants(T, H, I, E, K, d: DecodeConfig):  # noqa: E741
    d = resolve_decode(d, T, H, I, torch.device("cpu"), sms=NUM_SMS, l2=L2_BYTES)
    bt = max(16, triton.next_power_of_2(T))
    sig = {n: "*i32" for n in ("ids_ptr", "blk_e_ptr", "blk_pair_ptr", "blk_tok_ptr", "nblk_ptr")}
    sig.update(hidden_ptr="*bf16", w_ptr="*fp32", gu_ptr="*bf16", act_ptr="*bf16",
               blk_w_ptr="*fp32", T="i32", H="i32", I="i32", stride_ht="i32", stride_ge="i32",
               stride_gn="i32", num_progs="i32")
    bp = max(16, min(triton.next_power_of_2(T * K), 4096 // triton.next_power_of_2(E)))
    up = compile90(_moe_up_kernel, sig, dict(
        E=E, K=K, BLOCK_E=triton.next_power_of_2(E), BLOCK_KK=triton.next_power_of_2(K),
        BLOCK_T=bt, BLOCK_P=bp, BLOCK_M=d.block_m, BLOCK_N=d.up_n, BLOCK_K=d.up_k,
        EVEN_K=H % d.up_k == 0, DOT_F32=False, FLATTEN=d.flatten, USE_PDL=True),
        dict(T=T, H=H, I=I, stride_ht=H, stride_ge=2 * I * H, stride_gn=H,
             num_progs=NUM_SMS * d.programs_per_sm), d.up_warps, d.up_stages)
    bn = d.down_n
    sig = {n: "*i32" for n in ("blk_e_ptr", "blk_pair_ptr", "blk_tok_ptr", "nblk_ptr")}
    sig.update(act_ptr="*bf16", down_ptr="*bf16", y_ptr="*bf16", blk_w_ptr="*fp32", T="i32",
               H="i32", I="i32", stride_de="i32", stride_dn="i32", stride_yt="i32")
    down = compile90(_moe_down_kernel, sig, dict(
        BLOCK_T=bt, BLOCK_M=d.block_m, BLOCK_N=bn, BLOCK_K=d.down_k, EVEN_K=I % d.down_k == 0,
        DOT_F32=False, FLATTEN=d.flatten, USE_PDL=True),
        dict(T=T, H=H, I=I, stride_de=H * I, stride_dn=I, stride_yt=H), d.down_warps,
        d.down_stages)
    return up, down


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--all-configs", action="store_true", help="every bench_fused_moe candidate")
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args()
    configs = CANDIDATES if args.all_configs else {"default": DecodeConfig()}
    bad = []
    print(f"triton {triton.__version__}, sm_90a, {NUM_SMS} SMs")
    print(f"{'kernel':44} {'regs':>4} {'stack':>5} {'smem':>7} {'cp.async':>8}")

    def show(name, info, default):
        print(f"{name:44} {info['regs']:>4} {info['stack']:>5} {info['smem']:>7} "
              f"{info['async_copies']:>8}", flush=True)
        if default and (info["stack"] > 0 or (name.startswith("moe_") and info["async_copies"] == 0)):
            bad.append(name)

    for shape, (H, I, E, K) in SHAPES.items():  # noqa: E741
        for T in TOKENS:
            show(f"base_select {shape} T={T}", select_variant(T, H, E, K), True)
            for cname, d in configs.items():
                if d.block_m > 16 and T < 32:
                    continue
                up, down = moe_variants(T, H, I, E, K, d)
                show(f"moe_up {shape} T={T} {cname}", up, cname == "default")
                show(f"moe_down {shape} T={T} {cname}", down, cname == "default")
        for bf, rn in ((True, False), (False, True), (False, False)):
            show(f"base_select {shape} T=16 backfill={bf} renorm={rn}",
                 select_variant(16, H, E, K, bf, rn), True)
    if bad:
        print(f"local memory or unpipelined loads in default variants: {bad}")
    return 1 if (args.strict and bad) else 0


if __name__ == "__main__":
    sys.exit(main())
