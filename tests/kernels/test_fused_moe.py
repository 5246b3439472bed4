"""fused_moe == core moe_forward_ref on both paths (2-launch decode: moe_up + moe_down; 4-launch
blocked: align + 2 GEMMs + combine); dropped experts unread; every output written (poisoned)."""

import subprocess
import sys

import pytest
import torch
from kernel_helpers import DEVICE, experts, poisoned_outputs, routing

from base_sglang.core import moe_forward_ref
from base_sglang.kernels import fused_moe, moe_align
from base_sglang.kernels.fused_moe import SMEM_BUDGET, DecodeConfig, MoeConfig, resolve_decode
from base_sglang.kernels.moe_gemm import GemmConfig
from base_sglang.kernels.moe_up import moe_up

# bf16 inputs; the kernel accumulates in fp32 and rounds the SiLU*up activation to bf16 once, so it
# is compared with an fp32 reference on the same bf16 weights by relative L2 error
REL_TOL = 1e-2
BLOCKED = MoeConfig(decode=None)  # the 4-launch path at every T
PATHS = {"decode": MoeConfig(), "blocked": BLOCKED}


def rel_err(y, ref):
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def run(T, E, K, H=32, I=16, *, seed=0, one_expert=False, id_dtype=torch.int64, drop=(),  # noqa: E741
        config=None):
    logits, ids, w = routing(T, E, K, seed=seed, one_expert=one_expert, id_dtype=id_dtype)
    for t, k in drop:
        ids[t, k] = -1
    gate_up, down = experts(E, H, I, seed=seed)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(seed + 1)).bfloat16().to(DEVICE)
    with poisoned_outputs():
        y = fused_moe(x, ids, w, gate_up, down, config=config)
    ref = moe_forward_ref(x.float(), ids.long(), w, gate_up.float(), down.float())
    assert torch.isfinite(y).all()  # poisoned outputs: every element written
    return y, ref, (x, ids, w, gate_up, down)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("T,E,K", [(1, 5, 2), (7, 13, 3), (4, 8, 8), (2, 6, 6), (33, 9, 3)])
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64])
def test_matches_reference(path, T, E, K, id_dtype):
    y, ref, _ = run(T, E, K, id_dtype=id_dtype, seed=T, config=PATHS[path])
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    assert rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("path", list(PATHS))
def test_dropped_and_padded_slots(path):
    y, ref, _ = run(5, 7, 3, drop=[(0, 0), (2, 1), (4, 0), (4, 1), (4, 2)], config=PATHS[path])
    assert rel_err(y, ref) < REL_TOL
    assert (y[4] == 0).all()  # a row with every slot dropped outputs exactly 0


@pytest.mark.parametrize("path", list(PATHS))
def test_everything_dropped(path):
    y, ref, _ = run(4, 6, 2, drop=[(t, k) for t in range(4) for k in range(2)], config=PATHS[path])
    assert (y == 0).all()


@pytest.mark.parametrize("path", list(PATHS))
def test_unused_experts_are_never_read(path):
    T, E, K, H, I = 6, 9, 2, 32, 16  # noqa: E741
    y, ref, (x, ids, w, gate_up, down) = run(T, E, K, H, I, seed=2, config=PATHS[path])
    unused = torch.ones(E, dtype=torch.bool, device=DEVICE)
    unused[ids.flatten().long()] = False
    assert unused.any()
    gate_up[unused] = float("nan")
    down[unused] = float("nan")
    y_nan = fused_moe(x, ids, w, gate_up, down, config=PATHS[path])
    assert torch.isfinite(y_nan).all() and torch.equal(y_nan, y)


@pytest.mark.parametrize("config", [
    MoeConfig(),  # BLOCK_M 16: 20 pairs of expert 0 span two blocks
    MoeConfig(decode=DecodeConfig(block_m=32)),
    MoeConfig(decode=DecodeConfig(block_m=64)),  # what resolve_decode picks for huge experts
    BLOCKED,
])
def test_one_expert_spans_several_blocks(config):
    y, ref, _ = run(20, 6, 1, one_expert=True, seed=3, config=config)
    assert rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("config", [
    MoeConfig(block_m=32, up=GemmConfig(16, 32, 4, 2, True), down=GemmConfig(32, 16, 4, 2, True),
              decode=None),
    MoeConfig(block_m=16, up=GemmConfig(32, 64, 4, 2), down=GemmConfig(64, 64, 4, 2), decode=None),
    MoeConfig(decode=DecodeConfig(up_n=32, up_k=32, down_n=32, down_k=16)),
    MoeConfig(decode=DecodeConfig(up_n=16, up_k=16, down_n=16, down_k=32, programs_per_sm=2)),
    MoeConfig(decode=DecodeConfig(up_k=16, down_k=16, flatten=False)),
])
def test_tile_configs(config):
    y, ref, _ = run(9, 5, 2, H=48, I=40, seed=4, config=config)  # H, I not multiples of BLOCK_K
    assert rel_err(y, ref) < REL_TOL


def test_resolve_decode_block_m_and_stages():
    cpu = torch.device("cpu")
    small = resolve_decode(DecodeConfig(), 64, 2048, 768, cpu, sms=132, l2=60 << 20)
    assert (small.block_m, small.down_n, small.up_stages, small.down_stages) == (16, 16, 5, 6)
    # one expert's down matrix (117 MB) > L2 / 2: one block per expert, stages fit the budget
    big = resolve_decode(DecodeConfig(), 64, 4096, 14336, cpu, sms=132, l2=60 << 20)
    assert (big.block_m, big.down_n) == (64, 32)
    assert big.up_stages * (64 * 256 + 2 * 256 * 16) * 2 <= SMEM_BUDGET
    assert big.down_stages * (64 * 256 + 256 * 32) * 2 <= SMEM_BUDGET
    assert resolve_decode(DecodeConfig(), 8, 4096, 14336, cpu, sms=132, l2=60 << 20).block_m == 16
    assert resolve_decode(DecodeConfig(block_m=32), 8, 4096, 14336, cpu).block_m == 32


def test_decode_path_up_to_its_limit_and_blocked_beyond():
    for T in (64, 65):  # 65: past DECODE_MAX_T, the default config runs the blocked path
        y, ref, _ = run(T, 13, 4, seed=T)
        assert rel_err(y, ref) < REL_TOL


@pytest.mark.parametrize("path", list(PATHS))
def test_deterministic(path):
    y1, _, args = run(8, 7, 3, seed=5, config=PATHS[path])
    assert torch.equal(fused_moe(*args, config=PATHS[path]), y1)


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


@pytest.mark.parametrize("T", [5, 20])  # 5: rows = tokens (BLOCK_M = BLOCK_T); 20: compacted
def test_decode_blocks_list_exactly_the_kept_pairs(T):
    """moe_up's block table: experts ascending, every kept pair once, weights copied, unused rows
    (-1, -1, 0); an expert with more pairs than BLOCK_M spans consecutive blocks."""
    g = torch.Generator().manual_seed(T)
    t = torch.arange(T)
    slot0 = torch.where(t % 7 != 6, 3, t % 3)  # expert 3 popular (18 of 20 tokens)
    slot1 = (slot0 + 1 + t % 4) % 6  # distinct from slot 0
    slot1[::4] = -1  # dropped slots
    ids = torch.stack([slot0, slot1], 1).to(DEVICE)
    w = torch.rand(T, 2, generator=g).to(DEVICE)
    gate_up, _ = experts(6, 32, 16)
    x = torch.randn(T, 32, device=DEVICE).bfloat16()
    act = torch.empty(T * 2, 16, dtype=torch.bfloat16, device=DEVICE)
    with poisoned_outputs():
        blk = moe_up(x, ids, w, gate_up, act, block_m=16)
    n = int(blk.nblk)
    flat = ids.flatten()
    counts = torch.bincount(flat[flat >= 0].long(), minlength=6)
    assert n == int(((counts + 15) // 16).sum())
    assert (int(counts.max()) > 16) == (T > 16)  # T=20: expert 3 spans two blocks
    es = blk.blk_e[:n].tolist()
    assert es == sorted(es)
    seen = []
    for b in range(n):
        ok = blk.blk_pair[b] >= 0
        pairs = blk.blk_pair[b][ok]
        assert (flat[pairs.long()] == es[b]).all()
        assert torch.equal(blk.blk_tok[b][ok], pairs // 2)
        torch.testing.assert_close(blk.blk_w[b][ok], w.flatten()[pairs.long()])
        assert (blk.blk_tok[b][~ok] == -1).all() and (blk.blk_w[b][~ok] == 0).all()
        seen += pairs.tolist()
    assert sorted(seen) == (flat >= 0).nonzero().flatten().tolist()


def test_contract_errors():
    _, _, (x, ids, w, gate_up, down) = run(3, 5, 2)
    with pytest.raises(ValueError, match="hidden"):
        fused_moe(x.float(), ids, w, gate_up, down)
    with pytest.raises(ValueError, match="down"):
        fused_moe(x, ids, w, gate_up, down[:, :, :8])
    with pytest.raises(ValueError, match="ids"):
        fused_moe(x, ids.float(), w, gate_up, down)
    act = torch.empty(6, 16, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="block_m"):
        moe_up(x, ids, w, gate_up, act, block_m=24)


def test_package_import_does_not_need_triton():
    code = "import sys, base_sglang.kernels\nprint('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
