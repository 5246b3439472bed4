"""fused_moe (align + gated GEMM + down GEMM + combine) == core moe_forward_ref; dropped experts unread."""

import os
import subprocess
import sys

import pytest
import torch
from kernel_helpers import DEVICE, experts, routing

from base_sglang.core import moe_forward_ref
from base_sglang.kernels import fused_moe, moe_align
from base_sglang.kernels.fused_moe import MoeConfig
from base_sglang.kernels.moe_gemm import GemmConfig

# bf16 inputs; the kernel accumulates in fp32 and rounds the SiLU*up activation to bf16 once, so it
# is compared with an fp32 reference on the same bf16 weights by relative L2 error
REL_TOL = 1e-2


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def run(T, E, K, H=32, I=16, *, seed=0, one_expert=False, id_dtype=torch.int64, drop=(),  # noqa: E741
        config=None):
    logits, ids, w = routing(T, E, K, seed=seed, one_expert=one_expert, id_dtype=id_dtype)
    for t, k in drop:
        ids[t, k] = -1
    gate_up, down = experts(E, H, I, seed=seed)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().to(DEVICE)
    y = fused_moe(x, ids, w, gate_up, down, config=config)
    ref = moe_forward_ref(x.float(), ids.long(), w, gate_up.float(), down.float())
    return y, ref, (x, ids, w, gate_up, down)


@pytest.mark.parametrize("T,E,K", [(1, 5, 2), (7, 13, 3), (4, 8, 8)])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_matches_reference(T, E, K, id_dtype):
    y, ref, _ = run(T, E, K, id_dtype=id_dtype, seed=T)
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert rel_err(y, ref) < REL_TOL


def test_dropped_and_padded_slots():
    y, ref, _ = run(5, 7, 3, drop=[(0, 0), (2, 1), (4, 0), (4, 1), (4, 2)])
    assert rel_err(y, ref) < REL_TOL
    assert (y[4] == 0).all()  # a row with every slot dropped outputs exactly 0


def test_unused_experts_are_never_read():
    T, E, K, H, I = 6, 9, 2, 32, 16  # noqa: E741
    y, ref, (x, ids, w, gate_up, down) = run(T, E, K, H, I, seed=2)
    unused = torch.ones(E, dtype=torch.bool, device=DEVICE)
    unused[ids.flatten().long()] = False
    assert unused.any()
    gate_up[unused] = float("nan")
    down[unused] = float("nan")
    y_nan = fused_moe(x, ids, w, gate_up, down)
    assert torch.isfinite(y_nan).all() and torch.equal(y_nan, y)


def test_one_expert_spans_several_blocks():
    """20 pairs on expert 0 with BLOCK_M 16: two blocks of the same expert."""
    y, ref, _ = run(20, 6, 1, one_expert=True, seed=3)
    assert rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("config", [
    MoeConfig(block_m=32, up=GemmConfig(16, 32, 4, 2, True), down=GemmConfig(32, 16, 4, 2, True)),
    MoeConfig(block_m=16, up=GemmConfig(32, 64, 4, 2), down=GemmConfig(64, 64, 4, 2))])
def test_tile_configs(config):
    y, ref, _ = run(9, 5, 2, H=48, I=40, seed=4, config=config)  # H, I not multiples of BLOCK_K
    assert rel_err(y, ref) < REL_TOL


ONE = MoeConfig(block_m=16, up=GemmConfig(16, 16), down=GemmConfig(16, 16), one_launch=True)


@pytest.mark.parametrize("config", [None, MoeConfig(pair_major=True), ONE],
                         ids=["grouped", "pair_major", "one_launch"])
def test_out_and_in_place_equal_a_fresh_output(config):
    """out = hidden (SGLang's inplace call) gives the fresh result bit for bit, on every path."""
    y, ref, (x, ids, w, gate_up, down) = run(9, 6, 2, seed=7, config=config)
    assert rel_err(y, ref) < REL_TOL
    out = torch.full_like(x, float("nan"))
    assert fused_moe(x, ids, w, gate_up, down, config=config, out=out) is out and torch.equal(out, y)
    h = x.clone()
    assert fused_moe(h, ids, w, gate_up, down, config=config, out=h) is h and torch.equal(h, y)
    wide = torch.zeros(9, 64, dtype=x.dtype, device=DEVICE)[:, 8:40]  # row stride 64, unit columns
    assert fused_moe(x, ids, w, gate_up, down, config=config, out=wide) is wide and torch.equal(wide, y)
    with pytest.raises(ValueError, match="out: shape"):
        fused_moe(x, ids, w, gate_up, down, config=config, out=x[:8])
    with pytest.raises(ValueError, match="out: dtype"):
        fused_moe(x, ids, w, gate_up, down, config=config, out=x.half())
    with pytest.raises(ValueError, match="out: needs unit column stride"):
        fused_moe(x, ids, w, gate_up, down, config=config, out=torch.zeros(32, 9, dtype=x.dtype).t())


def test_deterministic():
    y1, _, args = run(8, 7, 3, seed=5)
    assert torch.equal(fused_moe(*args), y1)


def test_align_lists_exactly_the_kept_pairs():
    ids = torch.tensor([[3, 0], [-1, 3], [3, 5], [0, -1]], device=DEVICE)
    b = moe_align(ids, 6, 16)
    counts = b.counts.tolist()
    assert counts == [2, 0, 0, 3, 0, 1]
    assert b.pair_list[3, :3].tolist() == [0, 3, 4] and b.pair_list[0, :2].tolist() == [1, 6]
    assert b.pair_list[5, :1].tolist() == [5]
    n = int(b.num_blocks)
    assert n == 3 and sorted(b.block_expert[:n].tolist()) == [0, 3, 5]
    assert b.block_row[:n].tolist() == [0, 0, 0]


@pytest.mark.parametrize("T,K,E,block_m", [(4, 2, 6, 16), (16, 8, 128, 16), (33, 8, 64, 32), (5, 2, 8, 64), (1, 8, 128, 16)])
def test_sort_align_equals_scan_align(T, K, E, block_m):
    g = torch.Generator().manual_seed(T * 131 + E)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)]).int()
    ids[torch.rand(T, K, generator=g) < 0.3] = -1
    ids = ids.to(DEVICE)
    a, b = moe_align(ids, E, block_m, sort=False), moe_align(ids, E, block_m, sort=True)
    assert torch.equal(a.counts, b.counts) and int(a.counts.sum()) == int((ids >= 0).sum())
    for e in range(E):  # rows past counts[e] are never read, so only the listed rows must agree
        c = int(a.counts[e])
        assert torch.equal(a.pair_list[e, :c], b.pair_list[e, :c]), e
    n = int(a.num_blocks)
    assert n == int(b.num_blocks)
    assert torch.equal(a.block_expert[:n], b.block_expert[:n]) and torch.equal(a.block_row[:n], b.block_row[:n])


def test_align_mode_picks_the_sort_for_many_experts_and_bounded_pairs():
    from base_sglang.kernels.moe_align import SORT_MAX_PAIRS, use_sort

    assert use_sort(64 * 8, 128, "auto") and use_sort(16 * 4, 16, "auto")
    assert not use_sort(16 * 2, 8, "auto") and use_sort(16 * 2, 8, "sort")  # Mixtral: scan unless asked
    assert not use_sort(SORT_MAX_PAIRS + 1, 128, "sort") and not use_sort(64, 128, "scan")


def test_a_bad_align_mode_is_refused_naming_the_variable():
    code = "import base_sglang.kernels.moe_align"
    env = {**os.environ, "BASE_MOE_ALIGN": "radix"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "BASE_MOE_ALIGN" in r.stderr and "radix" in r.stderr


def test_contract_errors():
    _, _, (x, ids, w, gate_up, down) = run(3, 5, 2)
    with pytest.raises(ValueError, match="hidden"):
        fused_moe(x.float(), ids, w, gate_up, down)
    with pytest.raises(ValueError, match="down"):
        fused_moe(x, ids, w, gate_up, down[:, :, :8])
    with pytest.raises(ValueError, match="ids"):
        fused_moe(x, ids.float(), w, gate_up, down)


def test_package_import_does_not_need_triton():
    code = "import sys, base_sglang.kernels\nprint('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_submodule_import_does_not_shadow_its_function():
    """`import base_sglang.kernels.fused_moe` first (the import system then sets the package
    attribute to the module): the package names are still the functions."""
    code = ("import types\n"
            "import base_sglang.kernels.fused_moe, base_sglang.kernels.moe_gemm\n"
            "import base_sglang.kernels.base_score\n"
            "from base_sglang.kernels import base_score, fused_moe, moe_gemm\n"
            "from base_sglang.kernels.fused_moe import MoeConfig\n"
            "fns = (fused_moe, moe_gemm, base_score)\n"
            "print(all(callable(f) and not isinstance(f, types.ModuleType) for f in fns),\n"
            "      fused_moe.__module__, MoeConfig.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "base_sglang.kernels.fused_moe", "MoeConfig"]
