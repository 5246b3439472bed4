"""The whole expert-skipping MoE in ONE persistent launch: align, gate/up, down and combine.

    y[t] = sum_k weights[t, k] * down[e] @ (silu(gate[e] @ x_t) * (up[e] @ x_t)),  e = ids[t, k]
Same contract and weight layout as fused_moe (gate_up [E, 2I, H], down [E, H, I], -1 = dropped
slot, an expert no slot keeps is never read). At small T the four launches of fused_moe each pay a
launch, a ramp and a tail; here a grid of G programs (about one per SM, a cooperative launch, so all
are resident) walks one list of work units, program p taking units p, p + G, p + 2G, ...:
    align    (every program, redundantly, no launch) histogram of ids over E -> the n active experts
             in ascending id, j -> e_j; the rows of e_j are its pairs in ascending slot order
    up       units (j, n-tile of I)  act[pair, tile] = silu(x gate^T) * (x up^T), then arrive on
             flag[j]
    down     units (j, n-tile of H)  wait until flag[j] has all its arrivals, then
             out[pair, tile] = act[pair] @ down[e_j]^T (fp32), then arrive on hcount[tile]
    combine  the LAST down unit to arrive on hcount[tile] sums y[t, tile] = sum_k w[t,k] out[t*K+k]
             in slot order (fp32, exactly moe_combine's sum): no wait, no extra unit
Units are numbered up-then-down, expert-major, so a down unit only waits on units with smaller
numbers: the lowest unfinished unit can always run, and the grid cannot deadlock.
Synchronisation without memsets: one utils.barrier_buffer per (device, stream, size) holds [gen,
flag[JMAX], hcount[NH]]; every launch adds exactly 2^BAR_BITS to every entry (the first arrival of each adds
2^BAR_BITS minus the others' count, program 0 pads unused entries), so a program learns its launch's
base from its own arrival on gen, and "complete" is "the high bits moved". Graph replays need
nothing. Spins are bounded (~2^22 polls) so a broken counter cannot hang the GPU. Under the CPU
interpreter (programs run one after another) the grid is one program per unit, in unit order, so
every wait finds its flag already complete and the code is the code the GPU runs.
Deterministic: every output element is computed by one program in a fixed order.
TMA (tma=1: every weight tile, tma=2: the down tiles only) reads the [BN, BK] weight tiles through
host-made tensor descriptors (bulk tensor copies, zero-filled past the matrix) instead of pointer
loads: the same tiles, so the same output bit for bit, with fewer registers for addresses; an up
unit is then the whole BN1 tile (up_cols = BN1), which is why tma=2 exists.
IDLE_LOW (idle_low=True): when the units are fewer than the programs, the lowest program ids are
the idle ones, not the highest. The H200 puts programs 0-15 of a 264-program grid two to an SM on
SMs 124-131 (every stored trace), so at M = 8 (256 units) expert 0's up units shared SMs and ended
last; idle, programs 0-7 leave programs 8-15 alone on those SMs.
PAIR (pair_order=True, GPU grids of exactly 2 programs per SM only): program p walks the units from
place v(p) instead of p, where v puts the programs that are alone on their SM first. Every stored
H100 / H200 trace (benchmarks/results/*/trace) places a 2 x SMs grid the same way: programs 0-7 and
8-15 share SMs 124-131, and program p (16 <= p < G/2 + 8) shares its SM with p + G/2 - 8. So
F = [0..7] + [16..G/2+7] are on G/2 distinct SMs and S = the rest, and v = index in F, or G/2 +
index in S. At M = 8 (256 units, G = 264) no SM then runs two up units or two down units. Only
speed depends on the placement: v is a permutation, every program still walks its units in
ascending order, so the no-deadlock argument above holds for any placement.
TRACE (GPU only: inline PTX) writes %globaltimer stamps per unit and per program
(benchmarks/gpu/trace_moe_one.py reads them).
Shape legend: T tokens, K slots, P = T*K pairs, E experts, H hidden, I intermediate, BM rows per
tile, BN1/BN2 output columns per up/down tile, UPC <= BN1 of them used per up unit (fewer columns per
unit, more up units: they can spread over more SMs), BK1/BK2 reduction steps.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from base_sglang.kernels.utils import (
    BAR_BITS,
    barrier_buffer,
    check,
    check_moe_inputs,
    is_interpreter,
    launch_kwargs,
    num_sms,
    use_pdl,
)


@triton.jit
def _arrive(ptr, inc):
    """Release this program's stores, then add inc to *ptr; returns the old value."""
    tl.debug_barrier()  # every thread's stores happen before the arrival
    return tl.atomic_add(ptr, inc, sem="acq_rel", scope="gpu")


@triton.jit
def _wait_moved(ptr, base, BAR_BITS: tl.constexpr):
    """Spin until the high bits of *ptr leave base (all arrivals of this launch are in)."""
    high = -(1 << BAR_BITS)
    polls = 0
    while ((tl.load(ptr, volatile=True) & high) == base) & (polls < (1 << 22)):
        polls += 1
    tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _stamp(trace_ptr, row, col, pid, TRACE: tl.constexpr):
    """trace[row, col] = %globaltimer (ns); col 0 also writes %smid into col 3."""
    if TRACE:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [pid],
                                        dtype=tl.int64, is_pure=False, pack=1)
        tl.store(trace_ptr + row * 4 + col, now)
        if col == 0:
            sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [pid], dtype=tl.int32,
                                           is_pure=False, pack=1)
            tl.store(trace_ptr + row * 4 + 3, sm.to(tl.int64))


@triton.jit
def _pair_place(pid, n_prog):
    """v(pid) of PAIR (module docstring): a permutation of range(n_prog) for even n_prog >= 32."""
    half = n_prog // 2
    alone = (pid < 8) | ((pid >= 16) & (pid < half + 8))
    return tl.where(alone, tl.where(pid < 8, pid, pid - 8), half + tl.where(pid < 16, pid - 8, pid - half))


def pair_order_applies(n_prog: int, sms: int) -> bool:
    """pair_order acts on grids of exactly 2 programs per SM (the placement it was measured on)."""
    return sms >= 16 and n_prog == 2 * sms


@triton.jit
def _expert_pairs(ids_all, valid, e):
    """Expert e's pairs: mask [BP], row of each in e's list (ascending slot) [BP], count []."""
    mine = valid & (ids_all == e)  # [BP]
    mi = mine.to(tl.int32)
    return mine, tl.cumsum(mi, axis=0) - mi, tl.sum(mi, axis=0)


@triton.jit
def _rows(mine, pos, cnt, ps, r0, BLOCK_M: tl.constexpr):
    """Rows r0 .. r0+BM-1 of an expert's pair list: pair [BM] int64, row mask [BM]."""
    rows = r0 + tl.arange(0, BLOCK_M)  # [BM]
    hit = mine[None, :] & (pos[None, :] == rows[:, None])  # [BM, BP]
    pair = tl.sum(tl.where(hit, ps[None, :], 0), axis=1)  # [BM]
    return pair.to(tl.int64), rows < cnt


@triton.jit
def _moe_one_kernel(
    x_ptr, ids_ptr, wt_ptr, gu_ptr, dn_ptr, act_ptr, po_ptr, y_ptr, sync_ptr, trace_ptr,
    T, stride_x, stride_y, n_prog, n_units,
    H: tl.constexpr, I: tl.constexpr, E: tl.constexpr, K: tl.constexpr, JMAX: tl.constexpr,  # noqa: E741
    BLOCK_P: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_TC: tl.constexpr,
    BN1: tl.constexpr, BK1: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr, UPC: tl.constexpr,
    DOT_F32: tl.constexpr, BAR_BITS: tl.constexpr, USE_PDL: tl.constexpr, TRACE: tl.constexpr,
    TMA: tl.constexpr, IDLE_LOW: tl.constexpr, PAIR: tl.constexpr,
):
    NT1: tl.constexpr = (I + UPC - 1) // UPC  # up units per expert
    NT2: tl.constexpr = (H + BN2 - 1) // BN2  # down units per expert (= combine tiles)
    if USE_PDL:  # wait for the producer kernel, then let the next launch start early
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    _stamp(trace_ptr, n_units + pid, 0, pid, TRACE)  # trace rows: units, then programs
    P = T * K
    high = -(1 << BAR_BITS)
    one: tl.constexpr = 1 << BAR_BITS
    # ---- this launch's base: the program's own arrival on gen ---------------------------------
    old = tl.atomic_add(sync_ptr, tl.where(pid == 0, one - (n_prog - 1), 1), sem="relaxed", scope="gpu")
    base = old & high
    # ---- align, redundantly in every program ------------------------------------------------------
    ps = tl.arange(0, BLOCK_P)  # [BP]
    ids_all = tl.load(ids_ptr + ps, mask=ps < P, other=-1).to(tl.int32)  # [BP]
    valid = (ids_all >= 0) & (ids_all < E) & (ps < P)
    es = tl.arange(0, BLOCK_E)  # [BE]
    active = (tl.histogram(tl.where(valid, ids_all, 0), BLOCK_E, mask=valid) > 0) & (es < E)
    ai = active.to(tl.int32)
    rank = tl.cumsum(ai, axis=0) - ai  # [BE] j of each active expert
    n_act = tl.sum(ai, axis=0)
    js = tl.arange(0, JMAX)  # [JMAX]
    if pid == 0:  # pad the entries no unit of this launch arrives on
        tl.atomic_add(sync_ptr + 1 + js, js * 0 + one, mask=js >= n_act, sem="relaxed", scope="gpu")
        if n_act == 0:
            for nh in range(NT2):
                tl.atomic_add(sync_ptr + 1 + JMAX + nh, one, sem="relaxed", scope="gpu")
            for t0 in range(0, T, BLOCK_TC):  # nothing kept anywhere: y = 0
                ts = t0 + tl.arange(0, BLOCK_TC)  # [BTC]
                for h0 in range(0, H, BN2):
                    hh = h0 + tl.arange(0, BN2)  # [BN2]
                    tl.store(y_ptr + ts[:, None] * stride_y + hh[None, :],
                             tl.zeros([BLOCK_TC, BN2], dtype=y_ptr.dtype.element_ty),
                             mask=(ts < T)[:, None] & (hh < H)[None, :])
    u1 = n_act * NT1
    total = u1 + n_act * NT2
    first = pid
    if PAIR:  # the programs alone on their SM first (module docstring)
        first = _pair_place(pid, n_prog)
    if IDLE_LOW:  # at most one unit per program: the lowest program ids go idle (module docstring)
        first = pid - tl.maximum(n_prog - total, 0)
        first = tl.where(first < 0, total, first)
    _stamp(trace_ptr, n_units + pid, 1, pid, TRACE)
    for u in range(first, total, n_prog):
        _stamp(trace_ptr, u, 0, pid, TRACE)
        if u < u1:  # ---- up unit (j, tile of I) --------------------------------------------------
            j = u // NT1
            nt = u % NT1
            e = tl.sum(tl.where(active & (rank == j), es, 0), axis=0).to(tl.int64)
            ns = nt * UPC + tl.arange(0, BN1)  # [BN1]
            nmask = (tl.arange(0, BN1) < UPC) & (ns < I)
            ks = tl.arange(0, BK1)  # [BK1]
            mine, pos, cnt = _expert_pairs(ids_all, valid, e)
            for r0 in range(0, cnt, BLOCK_M):  # chunks of e's rows (one unless T > BM)
                pair, rmask = _rows(mine, pos, cnt, ps, r0, BLOCK_M)
                a_ptrs = x_ptr + (pair // K)[:, None] * stride_x + ks[None, :]  # [BM, BK1]
                if TMA == 1:  # gu_ptr: a descriptor over gate_up as [E*2I, H], block [BN1, BK1]
                    row = (e * (2 * I) + nt * UPC).to(tl.int32)
                else:
                    w_ptrs = gu_ptr + e * (2 * I * H) + ns[None, :].to(tl.int64) * H + ks[:, None]
                acc = tl.zeros([BLOCK_M, BN1], dtype=tl.float32)
                acc_up = tl.zeros([BLOCK_M, BN1], dtype=tl.float32)
                for k0 in range(0, H, BK1):
                    kmask = ks < H - k0
                    a = tl.load(a_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0)
                    if TMA == 1:  # bulk tensor copies, zero-filled past H
                        wg = gu_ptr.load([row, k0]).T  # [BK1, BN1]
                        wu = gu_ptr.load([row + I, k0]).T
                    else:
                        wg = tl.load(w_ptrs, mask=kmask[:, None] & nmask[None, :], other=0.0)
                        wu = tl.load(w_ptrs + I * H, mask=kmask[:, None] & nmask[None, :], other=0.0)
                        w_ptrs += BK1
                    if DOT_F32:  # the CPU interpreter computes bf16 dots wrongly
                        a = a.to(tl.float32)
                        wg = wg.to(tl.float32)
                        wu = wu.to(tl.float32)
                    acc = tl.dot(a, wg, acc)
                    acc_up = tl.dot(a, wu, acc_up)
                    a_ptrs += BK1
                acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # silu(gate) * up
                tl.store(act_ptr + pair[:, None] * I + ns[None, :],
                         acc.to(act_ptr.dtype.element_ty), mask=rmask[:, None] & nmask[None, :])
            _arrive(sync_ptr + 1 + j, tl.where(nt == 0, one - (NT1 - 1), 1))
            _stamp(trace_ptr, u, 1, pid, TRACE)
        else:  # ---- down unit (j, tile of H), then the combine if it arrives last --------------
            j = (u - u1) // NT2
            nh = (u - u1) % NT2
            e = tl.sum(tl.where(active & (rank == j), es, 0), axis=0).to(tl.int64)
            ns_d = nh * BN2 + tl.arange(0, BN2)  # [BN2]
            nmask_d = ns_d < H
            ks_d = tl.arange(0, BK2)  # [BK2]
            _wait_moved(sync_ptr + 1 + j, base, BAR_BITS)
            _stamp(trace_ptr, u, 1, pid, TRACE)
            mine, pos, cnt = _expert_pairs(ids_all, valid, e)
            for r0 in range(0, cnt, BLOCK_M):
                pair, rmask = _rows(mine, pos, cnt, ps, r0, BLOCK_M)
                a_d_ptrs = act_ptr + pair[:, None] * I + ks_d[None, :]  # [BM, BK2]
                if TMA != 0:  # dn_ptr: a descriptor over down as [E*H, I], block [BN2, BK2]
                    row_d = (e * H + nh * BN2).to(tl.int32)
                else:
                    w_d_ptrs = dn_ptr + e * (H * I) + ns_d[None, :].to(tl.int64) * I + ks_d[:, None]
                acc_d = tl.zeros([BLOCK_M, BN2], dtype=tl.float32)
                for k0 in range(0, I, BK2):
                    kmask = ks_d < I - k0
                    a_d = tl.load(a_d_ptrs, mask=rmask[:, None] & kmask[None, :], other=0.0,
                                  cache_modifier=".cg")  # written in this launch: via L2
                    if TMA != 0:
                        w_d = dn_ptr.load([row_d, k0]).T  # [BK2, BN2], zero-filled past I
                    else:
                        w_d = tl.load(w_d_ptrs, mask=kmask[:, None] & nmask_d[None, :], other=0.0)
                        w_d_ptrs += BK2
                    if DOT_F32:
                        a_d = a_d.to(tl.float32)
                        w_d = w_d.to(tl.float32)
                    acc_d = tl.dot(a_d, w_d, acc_d)
                    a_d_ptrs += BK2
                tl.store(po_ptr + pair[:, None] * H + ns_d[None, :], acc_d,
                         mask=rmask[:, None] & nmask_d[None, :])
            inc = tl.where(j == 0, one - (n_act - 1), 1)
            old_h = _arrive(sync_ptr + 1 + JMAX + nh, inc)
            if old_h + inc == base + one:  # every expert's tile nh is in: combine it
                tl.debug_barrier()
                for t0 in range(0, T, BLOCK_TC):
                    ts = t0 + tl.arange(0, BLOCK_TC)  # [BTC]
                    tmask = ts < T
                    acc_y = tl.zeros([BLOCK_TC, BN2], dtype=tl.float32)
                    for k in tl.static_range(K):
                        ek = tl.load(ids_ptr + ts * K + k, mask=tmask, other=-1)  # [BTC]
                        wk = tl.load(wt_ptr + ts * K + k, mask=tmask, other=0.0).to(tl.float32)
                        use = (ek >= 0) & (ek < E) & tmask
                        # a dropped slot's row is never written: it is read anyway (in bounds) and
                        # discarded by the where, so no load waits on the ids
                        xo = tl.load(po_ptr + (ts * K + k)[:, None].to(tl.int64) * H + ns_d[None, :],
                                     mask=tmask[:, None] & nmask_d[None, :], other=0.0,
                                     cache_modifier=".cg")  # [BTC, BN2]
                        acc_y += tl.where(use[:, None], wk[:, None] * xo, 0.0)
                    tl.store(y_ptr + ts[:, None] * stride_y + ns_d[None, :],
                             acc_y.to(y_ptr.dtype.element_ty), mask=tmask[:, None] & nmask_d[None, :])
        _stamp(trace_ptr, u, 2, pid, TRACE)
    _stamp(trace_ptr, n_units + pid, 2, pid, TRACE)


def check_options(bn1: int, up_cols: int | None, maxnreg: int | None, tma: int = 0) -> int:
    """moe_one's up_cols (None / 0 = BN1; a multiple of 8 up to BN1), maxnreg (None / 0 = none;
    24..255) and tma (0, 1 with up_cols = BN1, or 2) -> the columns per up unit (UPC). Also what
    MoeConfig checks when a table loads."""
    upc = up_cols or bn1
    check(8 <= upc <= bn1 and upc % 8 == 0, f"up_cols: a multiple of 8 in 8..{bn1} (BN1), got {up_cols}")
    check(not maxnreg or 24 <= maxnreg <= 255, f"maxnreg: 24..255 registers or None, got {maxnreg}")
    check(tma in (0, 1, 2) and (tma != 1 or upc == bn1),
          f"tma: 0, 1 (every weight tile; up_cols = BN1 = {bn1}) or 2 (down tiles), got tma {tma}, "
          f"up_cols {up_cols}")
    return upc


_FITS: dict[tuple, int] = {}


def programs_fit(n_regs: int, shared: int, num_warps: int, regs_sm: int = 65536,
                 smem_sm: int = 233472, threads_sm: int = 2048) -> int:
    """How many programs of n_regs registers per thread and `shared` bytes one SM holds at once
    (defaults: an H100/H200 SM)."""
    warp_regs = -(-max(n_regs, 1) * 32 // 256) * 256  # allocated per warp in units of 256
    fits = min(regs_sm // (warp_regs * num_warps), threads_sm // (32 * num_warps), 32,
               smem_sm // (shared + 1024) if shared else 32)
    return max(1, fits)


def programs_per_sm(compiled, num_warps: int, device: torch.device) -> int:
    """programs_fit for a compiled kernel on this device: the cooperative launch fails beyond it,
    so the grid is clamped to it."""
    compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    return programs_fit(compiled.n_regs, compiled.metadata.shared, num_warps,
                        getattr(props, "regs_per_multiprocessor", 65536),
                        getattr(props, "shared_memory_per_multiprocessor", 233472),
                        getattr(props, "max_threads_per_multi_processor", 2048))


def moe_one(
    hidden: torch.Tensor,  # [T, H] bf16/fp16, unit column stride
    ids: torch.Tensor,  # [T, K] int32/int64, -1 = dropped slot
    weights: torch.Tensor,  # [T, K] float combine weights
    gate_up: torch.Tensor,  # [E, 2I, H] contiguous, hidden's dtype
    down: torch.Tensor,  # [E, H, I] contiguous, hidden's dtype
    *,
    block_m: int = 16,
    up: tuple[int, int] = (32, 128),  # (BN1, BK1)
    down_tiles: tuple[int, int] = (64, 128),  # (BN2, BK2)
    up_cols: int | None = None,  # UPC: columns of I per up unit (default BN1; a multiple of 8)
    num_warps: int = 4,
    num_stages: int = 3,
    programs: int | None = None,  # grid size (default: one per SM; at most what fits at once)
    maxnreg: int | None = None,  # cap on registers per thread (GPU compile; more programs fit an SM)
    cooperative: bool = True,
    tma: int = 0,  # weight tiles by bulk tensor copies (TMA): 1 all (up_cols = BN1), 2 down only
    idle_low: bool = False,  # fewer units than programs: the lowest program ids idle
    pair_order: bool = False,  # 2 programs per SM: the programs alone on their SM walk first
    trace: torch.Tensor | None = None,  # int64 [>= units + grid, 4] zeros -> stamps; GPU only
) -> torch.Tensor:
    """Routed-expert output [T, H] in hidden's dtype, one launch (fp32 accumulation and combine).
    moe_one_units (every expert a pair could select active) bounds the rows trace needs."""
    T, H, E, I, K = check_moe_inputs(hidden, ids, weights, gate_up, down)  # noqa: E741
    dev = hidden.device
    bn1, bk1 = up
    bn2, bk2 = down_tiles
    nt2 = triton.cdiv(H, bn2)
    check(all(v >= 16 and v & (v - 1) == 0 for v in (bn1, bk1, bn2, bk2)),
          f"up, down_tiles: powers of 2 >= 16, got {up}, {down_tiles}")
    check(block_m >= 16 and block_m & (block_m - 1) == 0, f"block_m: power of 2 >= 16, got {block_m}")
    upc = check_options(bn1, up_cols, maxnreg, tma)
    check(not tma or (H % 8 == 0 and I % 8 == 0),
          f"tma: H and I must be multiples of 8 (16-byte rows), got H {H}, I {I}")
    check(not (pair_order and idle_low), "pair_order: not with idle_low (both choose the idle programs)")
    check(E < (1 << BAR_BITS), f"E: at most 2^{BAR_BITS} - 1 experts, got {E}")
    ids = ids.contiguous()
    weights = weights.contiguous()
    out = torch.empty((T, H), dtype=hidden.dtype, device=dev)
    P = T * K
    if P == 0:
        return out
    jmax = triton.next_power_of_2(min(E, P))
    act = torch.empty((P, I), dtype=hidden.dtype, device=dev)  # [P, I]
    pair_out = torch.empty((P, H), dtype=torch.float32, device=dev)  # [P, H]
    sync = barrier_buffer(dev, 1 + jmax + nt2)  # [gen, flag[JMAX], hcount[NT2]]
    interp = is_interpreter() or dev.type != "cuda"
    units = moe_one_units(T, E, K, H, I, up, down_tiles, upc)
    check(not interp or trace is None, "trace: inline PTX, CUDA only (not under the interpreter)")
    pdl = use_pdl(dev)
    extra = {} if interp else dict(launch_kwargs(pdl),
                                   **({"launch_cooperative_grid": True} if cooperative else {}),
                                   **({"maxnreg": maxnreg} if maxnreg else {}))
    consts = dict(H=H, I=I, E=E, K=K, JMAX=jmax, BLOCK_P=max(16, triton.next_power_of_2(P)),
                  BLOCK_E=triton.next_power_of_2(E), BLOCK_M=block_m, BLOCK_TC=16,
                  BN1=bn1, BK1=bk1, BN2=bn2, BK2=bk2, UPC=upc, DOT_F32=interp, BAR_BITS=BAR_BITS,
                  USE_PDL=pdl, TRACE=trace is not None, TMA=tma, IDLE_LOW=bool(idle_low), PAIR=False,
                  num_warps=num_warps,
                  num_stages=num_stages, **extra)
    trace_arg = sync if trace is None else trace
    gu_arg, dn_arg = gate_up, down
    if tma == 1:  # the kernel reads [BN, BK] weight tiles through these (bounds zero-fill)
        gu_arg = TensorDescriptor.from_tensor(gate_up.view(E * 2 * I, H), [bn1, bk1])
    if tma:
        dn_arg = TensorDescriptor.from_tensor(down.view(E * H, I), [bn2, bk2])
    args = (hidden, ids, weights, gu_arg, dn_arg, act, pair_out, out, sync, trace_arg,
            T, hidden.stride(0), out.stride(0))
    if interp:  # one program per unit, in unit order (see the module docstring)
        _moe_one_kernel[(units,)](*args, units, units, **consts)
        return out
    sms = num_sms(dev)
    key = (str(dev), hidden.dtype, ids.dtype, weights.dtype, T == 1, *sorted(consts.items()))
    n_prog = min(programs or sms, units)
    if key not in _FITS:  # compile once and read its resources (a grid over them cannot launch)
        compiled = _moe_one_kernel.warmup(*args, n_prog, units, grid=(1,), **consts)
        _FITS[key] = programs_per_sm(compiled, num_warps, dev)
    n_prog = min(n_prog, _FITS[key] * sms)
    if pair_order and pair_order_applies(n_prog, sms):  # (same resources: only the unit order moves)
        consts["PAIR"] = True
    if trace is not None:
        check(trace.dtype == torch.int64 and trace.is_contiguous() and trace.dim() == 2
              and trace.shape[1] == 4 and trace.shape[0] >= units + n_prog,
              f"trace: int64 [>= {units + n_prog}, 4] contiguous, got {trace.dtype} {tuple(trace.shape)}")
    _moe_one_kernel[(n_prog,)](*args, n_prog, units, **consts)
    return out


def moe_one_units(T: int, E: int, K: int, H: int, I: int, up: tuple[int, int],  # noqa: E741
                  down_tiles: tuple[int, int], up_cols: int | None = None) -> int:
    """The most work units one launch can have (every expert a pair could select active)."""
    return min(E, T * K) * (triton.cdiv(I, up_cols or up[0]) + triton.cdiv(H, down_tiles[0]))
