"""fused_moe's pair-major path (default at T = 1, and T = 2 with many experts) == core moe_forward_ref."""

import dataclasses

import pytest
import torch
from kernel_helpers import DEVICE, experts, routing

from base_sglang.core import moe_forward_ref
from base_sglang.kernels import fused_moe
from base_sglang.kernels.fused_moe import MoeConfig, default_config
from base_sglang.kernels.moe_gemm import GemmConfig

REL_TOL = 1e-2  # bf16 weights, fp32 accumulation, the activation rounded to bf16 once (as fused_moe)
PM = MoeConfig(pair_major=True, up=GemmConfig(16, 32, 4, 2), down=GemmConfig(16, 32, 4, 2))


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def inputs(T, E, K, H=48, I=40, *, seed=0, id_dtype=torch.int64):  # noqa: E741
    _, ids, w = routing(T, E, K, seed=seed, id_dtype=id_dtype)
    gate_up, down = experts(E, H, I, seed=seed)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().to(DEVICE)
    return x, ids, w, gate_up, down


def ref_of(x, ids, w, gate_up, down):
    return moe_forward_ref(x.float(), ids.long(), w, gate_up.float(), down.float())


@pytest.mark.parametrize("T,E,K", [(1, 5, 2), (1, 16, 8), (3, 7, 3)])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_matches_reference(T, E, K, id_dtype):
    args = inputs(T, E, K, seed=T + K, id_dtype=id_dtype)  # H=48, I=40: not multiples of BLOCK_K
    y = fused_moe(*args, config=PM)
    assert y.dtype == torch.bfloat16 and y.shape == (T, 48)
    assert rel_err(y, ref_of(*args)) < REL_TOL


@pytest.mark.parametrize("up,dn", [(GemmConfig(16, 16, 2, 3, True), GemmConfig(32, 64, 4, 2)),
                                   (GemmConfig(64, 64, 4, 1), GemmConfig(16, 16, 1, 3, True))])
def test_tile_configs(up, dn):
    args = inputs(2, 6, 2, H=64, I=32, seed=4)  # EVEN_K for one of the up configs
    y = fused_moe(*args, config=dataclasses.replace(PM, up=up, down=dn))
    assert rel_err(y, ref_of(*args)) < REL_TOL


def test_dropped_and_duplicate_slots():
    """-1 slots add nothing (a row of only -1 is exactly 0); a slot repeating an expert is a pair
    of its own, as in the grouped path and the reference."""
    x, ids, w, gate_up, down = inputs(3, 6, 3, seed=5)
    ids[0, 1] = -1
    ids[1, 2] = ids[1, 0]
    ids[2, :] = -1
    y = fused_moe(x, ids, w, gate_up, down, config=PM)
    assert rel_err(y, ref_of(x, ids, w, gate_up, down)) < REL_TOL
    assert (y[2] == 0).all()


def test_unused_experts_are_never_read():
    """Experts no slot keeps (including a dropped slot's) may hold NaN: they are never loaded."""
    x, ids, w, gate_up, down = inputs(1, 9, 3, seed=2)
    ids[0, 2] = -1
    y = fused_moe(x, ids, w, gate_up, down, config=PM)
    unused = torch.ones(9, dtype=torch.bool, device=DEVICE)
    unused[ids[ids >= 0].long()] = False
    assert int(unused.sum()) == 7
    gate_up[unused] = float("nan")
    down[unused] = float("nan")
    y_nan = fused_moe(x, ids, w, gate_up, down, config=PM)
    assert torch.isfinite(y_nan).all() and torch.equal(y_nan, y)


def test_agrees_with_grouped_path_and_is_deterministic():
    args = inputs(1, 12, 4, H=64, I=64, seed=6)
    y_pm = fused_moe(*args, config=PM)
    y_grouped = fused_moe(*args, config=MoeConfig())
    assert rel_err(y_pm, y_grouped) < REL_TOL
    assert torch.equal(fused_moe(*args, config=PM), y_pm)


def test_default_dispatch():
    assert default_config(1, 128, 8).pair_major and not default_config(3, 128, 8).pair_major
    args = inputs(1, 5, 2, seed=7)
    assert torch.equal(fused_moe(*args), fused_moe(*args, config=default_config(1, 5, 2)))


def test_contract_errors():
    from base_sglang.kernels.moe_gemm import moe_gemm

    x, ids, w, gate_up, down = inputs(2, 5, 2, seed=9)
    act = torch.empty(4, 40, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="ids"):
        moe_gemm(x, gate_up, act, None, a_div=2, gated=True)  # pair-major without ids
    with pytest.raises(ValueError, match="ids"):
        moe_gemm(x, gate_up, act, None, a_div=2, gated=True, ids=ids.float())
