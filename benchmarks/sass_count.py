"""SASS instruction counts of the route-select launch for sm_90, compiled here without a GPU (issue 12).

    python benchmarks/sass_count.py [--shape qwen3-30b-a3b] [--tokens 16] [--tiles 8,16,0,0 8,16,0,1]
        [--split | --moe [--trace]] [--json OUT.json]   (needs TRITON_INTERPRET unset: it compiles)
--split counts the two launches of kernels/base_route_split.py instead (--tiles are then
BASE_ROUTE_SPLIT_TILES variants): each launch's static instructions and longest path, and their sum.
--moe compiles the one-launch MoE (kernels/moe_one.py) with the H200's tuned budget tiles of that
shape and T (kernels/configs; --trace with its stamps on): instructions, registers, shared memory,
the programs per SM those allow (moe_one.programs_fit), the cp.async copies (LDGSTS: the
GEMM loops software-pipelined) and whether it reads %globaltimer.
Compiles kernels/base_route.py's kernel with Triton for an H100/H200 target (ptxas and cuobjdump
ship with Triton's wheel) at the constants and integer specialisations a real call gets, and
prints per variant (BASE_ROUTE_TILES = num_warps, rows per block, iterative top-k, scratch row,
narrow backfill width): static SASS instructions; the longest executed path (any; through the
narrow backfill, |S| <= COMPACT; through the full-tile one), from the control-flow graph of
nvdisasm's listing with its line info (loops once, divergent-warp fallbacks not taken); registers,
stack bytes and the most frequent opcodes. At small T the
launch is one program running a dependent chain, so its time on the GPU follows its instructions
per warp (Nsight Compute, fifth session: 3887 per warp x 5.19 cycles per issue = 12.3 us). With
Triton 3.6, the device's version, the Qwen3 T = 16 default compiles to the same 4016 instructions
that ncu listed there.
"""

from __future__ import annotations

import argparse
import collections
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_common import SHAPES  # noqa: E402

from base_sglang.kernels.base_fused import ID_BITS, SENTINEL  # noqa: E402
from base_sglang.kernels.base_route import _base_route_kernel, _top_of_s, route_blocks  # noqa: E402
from base_sglang.kernels.base_route_split import (  # noqa: E402
    _split_route_kernel,
    _split_select_kernel,
    split_blocks,
)
from base_sglang.kernels.moe_one import _moe_one_kernel, programs_fit  # noqa: E402
from base_sglang.kernels.utils import BAR_BITS  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SIGNATURE = dict(logits_ptr="*bf16", yhat_ptr="*bf16", b_ptr="*fp32", budget_ptr="*i64",
                 table_ptr="*fp32", out_ids_ptr="*i32", out_w_ptr="*fp32", counts_ptr="*i64",
                 removed_ptr="*fp32", ws_ptr="*fp32", T="i32", stride_l="i32", stride_y="i32",
                 alpha="fp32", part_ptr="*fp32", bits_ptr="*i32", rows_ptr="*fp32", kth_ptr="*i64",
                 pk_ptr="*fp32",
                 # kernels/moe_one.py
                 x_ptr="*bf16", ids_ptr="*i32", wt_ptr="*fp32", gu_ptr="*bf16", dn_ptr="*bf16",
                 act_ptr="*bf16", po_ptr="*fp32", y_ptr="*bf16", sync_ptr="*i32", trace_ptr="*i64",
                 stride_x="i32", n_prog="i32", n_units="i32")


def compile_sm90(fn, consts: dict, ints: dict, num_warps: int, num_stages: int = 3,
                 maxnreg: int | None = None, types: dict | None = None) -> dict:
    """SASS of fn for sm_90: instructions, registers, stack. `ints` get Triton's launch-time
    specialisation (1 -> constant, multiples of 16 -> divisibility), as a real call would;
    maxnreg caps the registers per thread (ptxas spills the rest to the stack)."""
    consts = dict(consts, **{k: 1 for k, v in ints.items() if v == 1})
    sig = {n: ("constexpr" if n in consts else (types or {}).get(n, SIGNATURE[n])) for n in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if sig[n].startswith("*") or (n in ints and n not in consts and ints[n] % 16 == 0)}
    ck = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs),
                        target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": num_warps, "num_stages": num_stages,
                                 **({"maxnreg": maxnreg} if maxnreg else {})})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
        lined = subprocess.run([os.path.join(BIN, "nvdisasm"), "--print-line-info", f.name],
                               capture_output=True, text=True, check=True).stdout
    ins = [line.split("*/", 1)[1].strip() for line in sass.splitlines()
           if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    ops = collections.Counter((s.split()[1] if s.startswith("@") else s.split()[0]).split(".")[0]
                              for s in ins)
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    return dict(instructions=len(ins), registers=int(m.group(1)), stack=int(m.group(2)), opcodes=ops,
                shared=ck.metadata.shared, sass=ins, lined=parse_lined(lined))


def parse_lined(text: str) -> list:
    """[(SASS text, (file name, line) or None)] of nvdisasm --print-line-info's .text section."""
    text = text[text.index("\n.text."):]
    where, rows, labels, pending = None, [], {}, []
    for line in text.splitlines():
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            labels.update({p: len(rows) for p in pending})
            pending = []
            rows.append([m.group(2), where])
    for r in rows:  # branch targets as instruction indices
        t = re.search(r"`\((\.L_x_\d+)\)", r[0])
        r.append(labels[t.group(1)] if t else None)
    return [tuple(r) for r in rows]


def _opcode(ins: str) -> str:
    return (ins.split()[1] if ins.startswith("@") else ins.split()[0])


def longest_path(lined: list, through: frozenset = frozenset(), avoid: frozenset = frozenset()):
    """Instructions on the longest path from the entry to an EXIT that runs a block holding one of
    the source lines `through` (when given) and no block holding one of `avoid`: what one warp
    executes when the branches go that way (None: no such path). Loops count once (backward
    branches dropped: at small T they run one trip); BRA.DIV, a divergent warp's fallback, is not
    taken."""
    n = len(lined)
    starts = {0}
    for i, (ins, _w, tgt) in enumerate(lined):
        if _opcode(ins).split(".")[0] in ("BRA", "EXIT") and i + 1 < n:
            starts.add(i + 1)
        if tgt is not None and _opcode(ins) == "BRA":
            starts.add(tgt)
    starts = sorted(starts)
    block_of = {s: b for b, s in enumerate(starts)}
    ends = starts[1:] + [n]
    best = [[None, None] for _ in starts]  # [block][ran `through` yet]: longest path to its start
    best[0][0] = 0
    done = [None, None]
    for b, (s, e) in enumerate(zip(starts, ends)):
        lines = {w for _i, w, _t in lined[s:e]}
        if lines & avoid:
            continue
        ins, _w, tgt = lined[e - 1]
        op = _opcode(ins)
        succ = [block_of[tgt]] if op == "BRA" and tgt is not None and tgt >= e else []
        if (ins.startswith("@") or op not in ("BRA", "EXIT")) and b + 1 < len(starts):
            succ.append(b + 1)  # falls through (BRA.DIV included)
        for v in (0, 1):
            if best[b][v] is None:
                continue
            length, v2 = best[b][v] + e - s, v | bool(lines & through)
            for c in succ:
                best[c][v2] = max(best[c][v2] or 0, length)
            if op == "EXIT":
                done[v2] = max(done[v2] or 0, length)
    return done[1] if through else max((d for d in done if d is not None), default=None)


def tiled(blocks, var: str, tiles: str | None, T: int, E: int, K: int) -> dict:
    """blocks(T, E, K) (route_blocks or split_blocks) with the tile override `var` set to `tiles`
    for the call (unset: the defaults)."""
    if tiles:
        os.environ[var] = tiles
    try:
        return blocks(T, E, K)
    finally:
        os.environ.pop(var, None)


def route_sass(shape: str, T: int, tiles: str | None = None) -> dict:
    """The route-select launch of one shape and T (budget select, base_plus weights, bf16 logits)."""
    s = SHAPES[shape]
    E, K = s["E"], s["K"]
    cfg = tiled(route_blocks, "BASE_ROUTE_TILES", tiles, T, E, K)
    num_warps = cfg.pop("num_warps")
    consts = dict(E=E, K=K, **cfg, SELECT=True, RENORM=s["norm_topk_prob"], BACKFILL=True,
                  COMBINE=2 if s["norm_topk_prob"] else 1, HAS_TABLE=False, KEY32=True, USE_PDL=True,
                  ID_BITS=ID_BITS, SENT=-(1 << 31), SENTINEL=SENTINEL)
    r = compile_sm90(_base_route_kernel, consts, dict(T=T, stride_l=2 * E, stride_y=2 * E), num_warps)
    narrow, full = backfill_lines()
    r.update(path=longest_path(r["lined"]), path_narrow=longest_path(r["lined"], narrow, full),
             path_full=longest_path(r["lined"], full, narrow))
    return r


def split_sass(shape: str, T: int, tiles: str | None = None) -> dict:
    """The two launches of base_route_split for one shape and T (as route_sass: budget select,
    base_plus weights, bf16 logits): instructions and longest path of each, and the summed path."""
    s = SHAPES[shape]
    E, K = s["E"], s["K"]
    cfg = tiled(split_blocks, "BASE_ROUTE_SPLIT_TILES", tiles, T, E, K)
    common = dict(E=E, K=K, BLOCK_E=cfg["BLOCK_E"], BLOCK_KK=cfg["BLOCK_KK"], BLOCK_T=cfg["BLOCK_T"],
                  RENORM=s["norm_topk_prob"], KEY32=True, ITER=cfg["ITER"], USE_PDL=True,
                  ID_BITS=ID_BITS, SENT=-(1 << 31))
    r1 = compile_sm90(_split_route_kernel, common, dict(T=T, stride_l=2 * E, stride_y=2 * E),
                      cfg["warps1"])
    r2 = compile_sm90(_split_select_kernel,
                      dict(common, N_CHUNKS=cfg["N_CHUNKS"], BLOCK_B=cfg["BLOCK_B"], BACKFILL=True,
                           COMBINE=2 if s["norm_topk_prob"] else 1, HAS_TABLE=False, SCRATCH=True,
                           COMPACT=cfg["COMPACT"], SLOT_R=cfg["SLOT_R"]),
                      dict(T=T, stride_l=2 * E), cfg["warps2"])
    p1, p2 = longest_path(r1["lined"]), longest_path(r2["lined"])
    return dict(instructions=r1["instructions"] + r2["instructions"], path=p1 + p2,
                route_instructions=r1["instructions"], route_path=p1, route_registers=r1["registers"],
                select_instructions=r2["instructions"], select_path=p2,
                select_registers=r2["registers"], stack=max(r1["stack"], r2["stack"]),
                registers=max(r1["registers"], r2["registers"]),
                opcodes=r1["opcodes"] + r2["opcodes"])


def backfill_lines() -> tuple:
    """Source lines of the two backfill top-ks: the narrow tile of S's columns (_top_of_s's body)
    and the full tile masked to S, as nvdisasm's line info names them."""
    src, first = inspect.getsourcelines(_top_of_s.fn)
    name = os.path.basename(inspect.getsourcefile(_top_of_s.fn))
    narrow = frozenset((name, first + i) for i in range(1, len(src)))
    with open(inspect.getsourcefile(_top_of_s.fn)) as f:
        full = frozenset((name, i + 1) for i, line in enumerate(f) if "_top(tl.where(in_s" in line)
    return narrow, full


def moe_sass(shape: str, T: int, trace: bool = False, maxnreg: int | None = None,
             tma: int = 0, idle_low: bool = False, pair_order: bool = False) -> dict:
    """The one-launch MoE of one shape and T with the H200's tuned budget tiles (M = 16 routing,
    bf16, int32 ids), under the row's maxnreg unless one is given: counts, resources and the
    programs per SM they allow."""
    from base_sglang.kernels.fused_moe import default_config

    s = SHAPES[shape]
    E, K, H, I = s["E"], s["K"], s["H"], s["I"]  # noqa: E741
    cfg = default_config(T, E, K, 16, hidden=H, inter=I, gpu="NVIDIA H200")
    P = T * K
    consts = dict(H=H, I=I, E=E, K=K, JMAX=triton.next_power_of_2(min(E, P)),
                  BLOCK_P=max(16, triton.next_power_of_2(P)), BLOCK_E=triton.next_power_of_2(E),
                  BLOCK_M=cfg.block_m, BLOCK_TC=16, BN1=cfg.up.block_n, BK1=cfg.up.block_k,
                  BN2=cfg.down.block_n, BK2=cfg.down.block_k, UPC=cfg.up_cols or cfg.up.block_n,
                  DOT_F32=False, BAR_BITS=BAR_BITS,
                  USE_PDL=True, TRACE=trace, TMA=tma, IDLE_LOW=idle_low, PAIR=pair_order)
    types = {}
    if tma == 1:  # the tuned row with TMA weight tiles: the up unit is the whole BN1 tile
        consts["UPC"] = cfg.up.block_n
        types["gu_ptr"] = f"tensordesc<bf16[{cfg.up.block_n},{cfg.up.block_k}]>"
    if tma:
        types["dn_ptr"] = f"tensordesc<bf16[{cfg.down.block_n},{cfg.down.block_k}]>"
    r = compile_sm90(_moe_one_kernel, consts, dict(T=T, stride_x=H, stride_y=H, n_prog=264,
                                                   n_units=1000), cfg.up.num_warps,
                     num_stages=cfg.up.num_stages, maxnreg=maxnreg or cfg.maxnreg or None,
                     types=types)
    warps = cfg.up.num_warps
    per_sm = programs_fit(r["registers"], r["shared"], warps)  # moe_one's clamp, an H100/H200 SM
    return dict(r, one_launch=cfg.one_launch, tiles=f"bm{cfg.block_m}/up{cfg.up.block_n},"
                f"{cfg.up.block_k},{warps},{cfg.up.num_stages}/dn{cfg.down.block_n},{cfg.down.block_k}",
                programs_per_sm=per_sm, ldgsts=r["opcodes"].get("LDGSTS", 0),
                utmaldg=r["opcodes"].get("UTMALDG", 0),
                globaltimer=any("GLOBALTIMER" in x for x in r["sass"]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--tokens", type=int, nargs="+", default=[16])
    ap.add_argument("--tiles", nargs="*", default=[None],
                    help="BASE_ROUTE_TILES variants (default: the shipped route_blocks)")
    ap.add_argument("--split", action="store_true",
                    help="the two launches of base_route_split (--tiles: BASE_ROUTE_SPLIT_TILES)")
    ap.add_argument("--moe", action="store_true",
                    help="the one-launch MoE (kernels/moe_one.py) with the tuned budget tiles")
    ap.add_argument("--trace", action="store_true", help="--moe: with the trace stamps compiled in")
    ap.add_argument("--maxnreg", type=int, nargs="+", default=[0],
                    help="--moe: register caps to compile (0 = the tuned row's, default)")
    ap.add_argument("--tma", type=int, default=0, choices=(0, 1, 2),
                    help="--moe: TMA weight tiles, moe_one(tma=N): 1 all, 2 down only")
    ap.add_argument("--idle-low", action="store_true", help="--moe: compiled with IDLE_LOW (moe_one idle_low)")
    ap.add_argument("--pair-order", action="store_true", help="--moe: compiled with PAIR (moe_one pair_order)")
    ap.add_argument("--json", help="also write the counts here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("TRITON_INTERPRET=1: this script compiles for sm_90; unset it")
    if args.moe:
        print(f"triton {triton.__version__}, sm_90, {args.shape}: the one-launch MoE, tuned budget tiles")
    else:
        print(f"triton {triton.__version__}, sm_90, {args.shape}; SASS: static instructions, then the "
              f"longest executed path: any, with |S| <= COMPACT (narrow backfill), with the full tile")
    rows = []
    for T in args.tokens:
        for tiles in args.tiles:
            if args.moe:
                for cap in args.maxnreg:
                    r = moe_sass(args.shape, T, args.trace, cap, args.tma, args.idle_low, args.pair_order)
                    rows.append(dict(T=T, trace=args.trace, maxnreg=cap, tma=args.tma, idle_low=args.idle_low,
                                     pair_order=args.pair_order, **{
                        k: v for k, v in r.items() if k not in ("opcodes", "sass", "lined")}))
                    print(f"T={T:<3} moe_one {r['tiles']:28} maxnreg {cap or '-':>3} "
                          f"{r['instructions']:6} instructions  {r['registers']:3} regs  {r['shared']} B "
                          f"shared -> {r['programs_per_sm']} per SM  LDGSTS {r['ldgsts']}  "
                          f"UTMALDG {r['utmaldg']}  stack "
                          f"{r['stack']}  globaltimer {r['globaltimer']}")
                continue
            if args.split:
                r = split_sass(args.shape, T, tiles)
                rows.append(dict(T=T, tiles=tiles, **{k: v for k, v in r.items() if k != "opcodes"}))
                print(f"T={T:<3} split tiles {tiles or 'default':12} route {r['route_instructions']:5} "
                      f"path {r['route_path']:5} | select {r['select_instructions']:5} path "
                      f"{r['select_path']:5} | path sum {r['path']:5}  stack {r['stack']}")
                continue
            r = route_sass(args.shape, T, tiles)
            rows.append(dict(T=T, tiles=tiles, **{k: v for k, v in r.items()
                                                  if k not in ("opcodes", "sass", "lined")}))
            top = " ".join(f"{o}:{n}" for o, n in r["opcodes"].most_common(6))
            paths = " ".join(f"{r[k] if r[k] is not None else '-':>5}" for k in
                             ("path", "path_narrow", "path_full"))
            print(f"T={T:<3} tiles {tiles or 'default':12} {r['instructions']:6} {paths}  "
                  f"{r['registers']:3} regs  stack {r['stack']:3}  {top}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(triton=triton.__version__, shape=args.shape, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
