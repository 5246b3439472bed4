"""moe_one (the MoE layer in one persistent launch) == core moe_forward_ref and fused_moe's 4 launches.

Under the interpreter the grid is one program per work unit, in unit order, so the same kernel code
runs (histogram align, up units, flags, down units, last-arrival combine) without a concurrent spin.
"""

import json
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from kernel_helpers import DEVICE, experts, routing

from base_sglang.core import moe_forward_ref
from base_sglang.kernels import fused_moe, moe_one
from base_sglang.kernels.fused_moe import MoeConfig
from base_sglang.kernels.moe_gemm import GemmConfig
from base_sglang.kernels.moe_one import _pair_place, pair_order_applies
from base_sglang.kernels.utils import _BARRIERS, BAR_BITS

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
REL_TOL = 1e-2  # bf16 weights, fp32 accumulation, the activation rounded to bf16 once
TILES = dict(up=(16, 16), down_tiles=(16, 16), block_m=16)


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def case(T, E, K, H=32, I=16, *, seed=0, id_dtype=torch.int64, one_expert=False):  # noqa: E741
    _, ids, w = routing(T, E, K, seed=seed, id_dtype=id_dtype, one_expert=one_expert)
    gate_up, down = experts(E, H, I, seed=seed)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().to(DEVICE)
    return x, ids, w, gate_up, down


def ref_of(x, ids, w, gate_up, down):
    return moe_forward_ref(x.float(), ids.long(), w, gate_up.float(), down.float())


@pytest.mark.parametrize("T,E,K,H,I", [(1, 5, 2, 32, 16), (7, 13, 3, 32, 16), (4, 8, 8, 32, 16),
                                       (5, 7, 3, 48, 40)])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_matches_reference_and_four_launches(T, E, K, H, I, id_dtype):  # noqa: E741
    x, ids, w, gu, dn = case(T, E, K, H, I, seed=T, id_dtype=id_dtype)
    y = moe_one(x, ids, w, gu, dn, **TILES)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    assert rel_err(y, ref_of(x, ids, w, gu, dn)) < REL_TOL
    # same per-pair GEMMs (one row block per expert) and the same slot-order fp32 combine
    four = fused_moe(x, ids, w, gu, dn, config=MoeConfig(block_m=16, up=GemmConfig(16, 16),
                                                         down=GemmConfig(16, 16)))
    assert rel_err(y, four) < 1e-3


@pytest.mark.parametrize("up_cols", [8, 16])
def test_fewer_columns_per_up_unit_same_output(up_cols):
    # UPC < BN1: more up units, each using the first UPC columns of its tile (I = 40: 5 units of 8)
    x, ids, w, gu, dn = case(5, 7, 3, 48, 40, seed=4)
    y = moe_one(x, ids, w, gu, dn, up_cols=up_cols, **TILES)
    assert rel_err(y, ref_of(x, ids, w, gu, dn)) < REL_TOL
    assert torch.equal(y, moe_one(x, ids, w, gu, dn, **TILES))  # per element the same dot products
    cfg = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True,
                    up_cols=up_cols)
    assert torch.equal(fused_moe(x, ids, w, gu, dn, config=cfg), y)


@triton.jit
def _places_kernel(out_ptr, n_prog):
    pid = tl.program_id(0)
    tl.store(out_ptr + pid, _pair_place(pid, n_prog))


def pair_places(n_prog: int) -> list[int]:
    """v(p) for every program p, computed by the kernel's own _pair_place."""
    out = torch.full((n_prog,), -1, dtype=torch.int32, device=DEVICE)
    _places_kernel[(n_prog,)](out, n_prog)
    return out.tolist()


@pytest.mark.parametrize("n_prog", [32, 132, 264, 228])
def test_pair_place_is_a_permutation(n_prog):
    assert sorted(pair_places(n_prog)) == list(range(n_prog))
    assert pair_order_applies(264, 132) and not pair_order_applies(396, 132)
    assert not pair_order_applies(16, 8)


@pytest.mark.parametrize("trace", ["small_units_h100/call1/trace", "kernels_h200_idle/call1/r1/trace"])
def test_pair_place_puts_the_first_half_on_distinct_sms(trace):
    # the placement pair_order assumes, against stored GPU timelines (an H100 and an H200): the
    # programs with v < G/2 are on G/2 distinct SMs, so the first G/2 units never share an SM
    doc = json.loads((RESULTS / trace / "trace_moe_one.json").read_text())
    v = pair_places(264)
    for raw in doc["raw_traces"]:
        sm = [row[3] for row in raw["rows"][raw["units"]:] if row[0] > 0]
        if len(sm) != 264:
            continue
        first = {sm[p] for p in range(264) if v[p] < 132}
        assert len(first) == 132
        shipped = {sm[p] for p in range(128)}  # without it the first 128 programs share 8 SMs
        assert len(shipped) == 120


def test_pair_order_same_output_and_checked():
    x, ids, w, gu, dn = case(7, 13, 3, seed=7)
    y = moe_one(x, ids, w, gu, dn, **TILES)
    # under the interpreter (and on grids other than 2 per SM) it changes nothing
    assert torch.equal(moe_one(x, ids, w, gu, dn, pair_order=True, **TILES), y)
    with pytest.raises(ValueError, match="pair_order"):
        moe_one(x, ids, w, gu, dn, pair_order=True, idle_low=True, **TILES)
    row = dict(block_m=16, pair_major=False, up={}, down={}, one_launch=True, pair_order=1)
    assert MoeConfig.from_dict(row).pair_order == 1
    for bad in (dict(pair_order=2), dict(pair_order=1, idle_low=1)):
        with pytest.raises(ValueError, match="pair_order"):
            MoeConfig.from_dict({**row, **bad})


@pytest.mark.parametrize("T,E,K,H,I", [(5, 7, 3, 48, 40), (4, 8, 8, 32, 16)])
def test_tma_tiles_same_output(T, E, K, H, I):  # noqa: E741
    # descriptor loads of [BN, BK] tiles (zero-filled past H and I: 48 = 3 x 16, 40 = 2.5 x 16;
    # the last up tile of an expert reaches into its up rows, the last down tile into the next
    # expert) give the pointer path's tiles: the same output bit for bit
    x, ids, w, gu, dn = case(T, E, K, H, I, seed=T + 9)
    y = moe_one(x, ids, w, gu, dn, tma=1, **TILES)
    assert rel_err(y, ref_of(x, ids, w, gu, dn)) < REL_TOL
    assert torch.equal(y, moe_one(x, ids, w, gu, dn, **TILES))
    assert torch.equal(y, moe_one(x, ids, w, gu, dn, tma=2, **TILES))  # the down tiles alone
    assert torch.equal(y, moe_one(x, ids, w, gu, dn, tma=2, up=(32, 16), up_cols=16,
                                  down_tiles=(16, 16), block_m=16))  # narrow up units, TMA down
    cfg = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True,
                    tma=1)
    assert torch.equal(fused_moe(x, ids, w, gu, dn, config=cfg), y)
    assert MoeConfig.from_dict({**vars(cfg), "up": vars(cfg.up), "down": vars(cfg.down),
                                "tma": 2}).tma == 2


def test_tma_refuses_narrow_up_units_and_odd_rows():
    x, ids, w, gu, dn = case(2, 4, 2)
    with pytest.raises(ValueError, match="tma"):
        moe_one(x, ids, w, gu, dn, tma=1, up_cols=8, **TILES)
    with pytest.raises(ValueError, match="tma"):
        moe_one(x, ids, w, gu, dn, tma=3, **TILES)
    x, ids, w, gu, dn = case(2, 4, 2, H=36, I=20)
    for mode in (1, 2):
        with pytest.raises(ValueError, match="tma"):
            moe_one(x, ids, w, gu, dn, tma=mode, **TILES)


@pytest.mark.parametrize("up_cols", [12, 32, 4])
def test_bad_up_cols_name_the_field(up_cols):
    x, ids, w, gu, dn = case(2, 4, 2)
    with pytest.raises(ValueError, match="up_cols"):
        moe_one(x, ids, w, gu, dn, up_cols=up_cols, **TILES)


def test_dropped_slots_rows_and_everything():
    x, ids, w, gu, dn = case(5, 7, 3, seed=3)
    ids = ids.clone()
    ids[0, 0] = ids[2, 1] = -1
    ids[4] = -1  # a token with every slot dropped outputs exactly 0
    y = moe_one(x, ids, w, gu, dn, **TILES)
    assert rel_err(y, ref_of(x, ids, w, gu, dn)) < REL_TOL
    assert (y[4] == 0).all() and (y[:4] != 0).any()
    ids[:] = -1  # nothing kept anywhere: no unit runs, y is still written (zeros)
    y0 = moe_one(x, ids, w, gu, dn, **TILES)
    assert (y0 == 0).all()


def test_out_of_range_ids_are_dropped_slots():
    x, ids, w, gu, dn = case(4, 6, 2, seed=5)
    bad = ids.clone()
    bad[1, 0] = 6  # == E: outside [0, E), skipped like -1
    dropped = ids.clone()
    dropped[1, 0] = -1
    assert torch.equal(moe_one(x, bad, w, gu, dn, **TILES), moe_one(x, dropped, w, gu, dn, **TILES))


def test_unused_experts_are_never_read():
    x, ids, w, gu, dn = case(6, 9, 2, seed=2)
    unused = torch.ones(9, dtype=torch.bool, device=DEVICE)
    unused[ids.flatten()] = False
    assert unused.any()
    y = moe_one(x, ids, w, gu, dn, **TILES)
    gu, dn = gu.clone(), dn.clone()
    gu[unused] = float("nan")
    dn[unused] = float("nan")
    assert torch.equal(moe_one(x, ids, w, gu, dn, **TILES), y)


def test_expert_rows_beyond_one_row_block():
    """20 tokens all routing expert 0: its 20 rows take two BLOCK_M = 16 chunks in each unit."""
    x, ids, w, gu, dn = case(20, 6, 2, seed=4, one_expert=True)
    assert int((ids == 0).sum()) == 20
    y = moe_one(x, ids, w, gu, dn, **TILES)
    assert rel_err(y, ref_of(x, ids, w, gu, dn)) < REL_TOL


def test_repeated_launches_keep_the_sync_entries_aligned():
    """No memset: every launch moves every sync entry by exactly 2^BAR_BITS, whatever its routing,
    and the results stay bit-identical across launches with different kept sets."""
    x, ids, w, gu, dn = case(6, 8, 2, seed=6)
    first = moe_one(x, ids, w, gu, dn, **TILES)
    few = ids.clone()
    few[:, 1] = -1
    few[3:] = -1
    ref_few = moe_one(x, few, w, gu, dn, **TILES)
    before = {k: v.clone() for k, v in _BARRIERS.items()}
    for i in range(3):
        assert torch.equal(moe_one(x, ids if i % 2 == 0 else few, w, gu, dn, **TILES),
                           first if i % 2 == 0 else ref_few)
    moved = [k for k in _BARRIERS if k in before and not torch.equal(_BARRIERS[k], before[k])]
    assert len(moved) == 1
    buf = _BARRIERS[moved[0]]
    assert torch.equal((buf - before[moved[0]]).long(), torch.full_like(buf, 3 << BAR_BITS).long())


def test_one_launch_rows_above_their_pairs_run_grouped():
    """A one-launch row looked up for a larger batch (the table takes the largest tuned T <= T)
    runs the 4-launch structure with the same tiles once T*K exceeds ONE_MAX_PAIRS."""
    from base_sglang.kernels.fused_moe import ONE_MAX_PAIRS

    x, ids, w, gu, dn = case(ONE_MAX_PAIRS // 2 + 1, 5, 2, seed=8)
    tiles = dict(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16))
    before = {k: v.clone() for k, v in _BARRIERS.items()}
    one = fused_moe(x, ids, w, gu, dn, config=MoeConfig(**tiles, one_launch=True))
    assert {k: v for k, v in _BARRIERS.items() if k not in before} == {}  # moe_one never launched
    assert all(torch.equal(before[k], v) for k, v in _BARRIERS.items())
    assert torch.equal(one, fused_moe(x, ids, w, gu, dn, config=MoeConfig(**tiles)))
    x, ids, w, gu, dn = case(ONE_MAX_PAIRS // 2, 5, 2, seed=8)  # at the bound: one launch
    fused_moe(x, ids, w, gu, dn, config=MoeConfig(**tiles, one_launch=True))
    assert any(k not in before or not torch.equal(before[k], v) for k, v in _BARRIERS.items())


def test_through_fused_moe_config():
    x, ids, w, gu, dn = case(7, 13, 3, seed=7)
    cfg = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True)
    y = fused_moe(x, ids, w, gu, dn, config=cfg)
    assert torch.equal(y, moe_one(x, ids, w, gu, dn, **TILES))
    assert MoeConfig.from_dict(dict(block_m=16, pair_major=False, up={}, down={})).one_launch is False
    row = dict(block_m=16, pair_major=False, up={}, down={}, one_launch=True, maxnreg=168)
    assert MoeConfig.from_dict(row).maxnreg == 168
    for bad, field in ((dict(maxnreg=8), "maxnreg"), (dict(up_cols=12), "up_cols"),
                       (dict(up_cols=64, up=dict(block_n=32)), "up_cols"),
                       (dict(tma=3), "tma"), (dict(tma=1, up_cols=16), "tma")):  # refused at load
        with pytest.raises(ValueError, match=field):
            MoeConfig.from_dict({**row, **bad})
    capped = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True,
                       maxnreg=168)  # a register cap changes the compile, not the result
    assert torch.equal(fused_moe(x, ids, w, gu, dn, config=capped), y)


@pytest.mark.parametrize("kwargs,field", [(dict(block_m=24), "block_m"), (dict(up=(24, 16)), "up"),
                                          (dict(down_tiles=(16, 8)), "down_tiles"),
                                          (dict(maxnreg=16), "maxnreg"), (dict(maxnreg=256), "maxnreg")])
def test_bad_tiles_name_the_field(kwargs, field):
    x, ids, w, gu, dn = case(2, 4, 2)
    with pytest.raises(ValueError, match=field):
        moe_one(x, ids, w, gu, dn, **{**TILES, **kwargs})


def test_bad_inputs_name_the_tensor():
    x, ids, w, gu, dn = case(2, 4, 2)
    with pytest.raises(ValueError, match="down"):
        moe_one(x, ids, w, gu, dn[:, :, :8].contiguous(), **TILES)
    with pytest.raises(ValueError, match="hidden"):
        moe_one(x.float(), ids, w, gu, dn, **TILES)


def test_trace_is_checked():
    x, ids, w, gu, dn = case(2, 4, 2)
    if DEVICE != "cuda":  # inline PTX: the interpreter refuses it, naming it
        with pytest.raises(ValueError, match="trace"):
            moe_one(x, ids, w, gu, dn, trace=torch.zeros(64, 4, dtype=torch.int64), **TILES)
    else:
        with pytest.raises(ValueError, match="trace"):
            moe_one(x, ids, w, gu, dn, trace=torch.zeros(1, 4, dtype=torch.int64, device=DEVICE),
                    **TILES)


@pytest.mark.skipif(DEVICE != "cuda", reason="inline PTX: %globaltimer, %smid")
def test_trace_stamps_every_unit_that_runs():
    x, ids, w, gu, dn = case(16, 32, 4, H=256, I=128, seed=5)
    tiles = dict(up=(32, 64), down_tiles=(64, 64), block_m=16)
    y0 = moe_one(x, ids, w, gu, dn, **tiles)
    n_act = int(torch.unique(ids[ids >= 0]).numel())
    units = min(32, 64) * (128 // 32 + 256 // 64)
    tr = torch.zeros(units + 8, 4, dtype=torch.int64, device=DEVICE)
    assert torch.equal(moe_one(x, ids, w, gu, dn, programs=8, trace=tr, **tiles), y0)
    ran = tr[: n_act * 8].cpu()
    assert (ran[:, 0] > 0).all() and (ran[:, 0] <= ran[:, 1]).all() and (ran[:, 1] <= ran[:, 2]).all()
    assert (tr[n_act * 8: units] == 0).all()  # units of experts that are not active never ran
    progs = tr[units:].cpu()
    assert (progs[:, 0] <= progs[:, 1]).all() and (progs[:, 1] <= progs[:, 2]).all()


def test_programs_fit_counts_registers_shared_memory_and_threads():
    from base_sglang.kernels.moe_one import programs_fit

    assert programs_fit(190, 73728, 4) == 2  # registers bind (Qwen3 T = 16 under Triton 3.6)
    assert programs_fit(168, 73728, 4) == 3  # shared memory binds
    assert programs_fit(32, 0, 4) == 16  # threads bind
    assert programs_fit(255, 200_000, 8) == 1


@pytest.mark.parametrize("T,E,K", [(3, 13, 2), (5, 13, 2)])
def test_idle_low_same_output(T, E, K):
    # fewer active experts than the grid's bound (E > T*K or experts no slot picks): with
    # idle_low the lowest program ids idle and the others take units 0, 1, ...: the same units,
    # the same order under the interpreter, the same output bit for bit
    x, ids, w, gu, dn = case(T, E, K, 48, 40, seed=T + 30, one_expert=True)  # expert 0 shared
    assert torch.unique(ids).numel() < min(E, T * K)  # so some programs idle
    y = moe_one(x, ids, w, gu, dn, **TILES)
    assert torch.equal(moe_one(x, ids, w, gu, dn, idle_low=True, **TILES), y)
    cfg = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True,
                    idle_low=1)
    assert torch.equal(fused_moe(x, ids, w, gu, dn, config=cfg), y)
    row = {**vars(cfg), "up": vars(cfg.up), "down": vars(cfg.down)}
    assert MoeConfig.from_dict(row).idle_low == 1
    with pytest.raises(ValueError, match="idle_low"):
        MoeConfig.from_dict({**row, "idle_low": 2})
