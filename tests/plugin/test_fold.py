"""The predictor folded into real sglang router GEMMs (plugin/fold.py) == the unfolded plugin path."""

from __future__ import annotations

import pytest
import torch
from plugin_helpers import E, H, K

from base_sglang.core import SelectionConfig
from base_sglang.plugin.config import PluginConfig
from base_sglang.plugin.fold import fold_gates


class Block(torch.nn.Module):
    """The routing part of an SGLang MoE block: `router_logits, _ = self.gate(x); self.topk(x, ...)`
    (Qwen3-MoE, OLMoE, Mixtral), with the real ReplicatedLinear and TopK."""

    def __init__(self, layer_id=1, renormalize=True, seed=0, **topk_kw):
        super().__init__()
        from sglang.srt.layers.linear import ReplicatedLinear
        from sglang.srt.layers.moe.topk import TopK

        self.gate = ReplicatedLinear(H, E, bias=False, params_dtype=torch.float32)
        g = torch.Generator().manual_seed(seed)
        self.gate.weight.data.copy_(torch.randn(E, H, generator=g))
        self.topk = TopK(top_k=K, layer_id=layer_id, renormalize=renormalize, **topk_kw)

    def forward(self, x):
        router_logits, _ = self.gate(x)
        return self.topk(x, router_logits)


def _pair(renormalize=True, seed=0):
    folded, plain = Block(renormalize=renormalize, seed=seed), Block(renormalize=renormalize, seed=seed)
    return folded, plain


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("budgets, T", [([2, 2, 2, 2, 2, 2], 6), ([1, 3, 2, 8, 1], 8), ([3], 1)])
def test_folded_block_equals_the_unfolded_plugin(base_state, renormalize, budgets, T):
    folded, plain = _pair(renormalize, seed=T)
    left = fold_gates(folded, base_state.predictor, base_state.selection)
    assert left == {}
    assert folded.topk.base_fold == E and tuple(folded.gate.weight.shape) == (2 * E, H)
    torch.testing.assert_close(folded.gate.weight[:E], plain.gate.weight, rtol=0, atol=0)
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(T))
    with base_state.decode_step(budgets):
        got = folded(x)
        base_state.num_kept.zero_()
        want = plain(x)
    assert torch.equal(got.topk_ids, want.topk_ids), (got.topk_ids, want.topk_ids)
    torch.testing.assert_close(got.topk_weights, want.topk_weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.router_logits, want.router_logits, rtol=1e-5, atol=1e-5)
    n = len(budgets)
    assert (got.topk_ids[n:] == -1).all() and (got.topk_weights[n:] == 0).all()  # padded rows


def test_outside_decode_steps_sglang_routes_the_first_half(base_state):
    folded, plain = _pair(seed=3)
    fold_gates(folded, base_state.predictor, base_state.selection)
    x = torch.randn(9, H)
    got, want = folded(x), plain(x)  # prefill: the gate closed, SGLang's own top-k
    # the stacked GEMM may round the logits differently in the last bit (BLAS blocking)
    assert torch.equal(got.topk_ids, want.topk_ids)
    torch.testing.assert_close(got.topk_weights, want.topk_weights, rtol=1e-5, atol=1e-6)
    assert got.router_logits.shape == (9, E)


def test_blocks_that_cannot_fold_are_left_with_the_reason(base_state):
    grouped = Block(use_grouped_topk=True, topk_group=1, num_expert_group=1)
    left = fold_gates(grouped, base_state.predictor, base_state.selection)
    assert "plain softmax top-k" in left[1] and not hasattr(grouped.topk, "base_fold")
    assert tuple(grouped.gate.weight.shape) == (E, H)
    block = Block()
    left = fold_gates(block, base_state.predictor, SelectionConfig(policy="oea"))
    assert "'oea'" in left[1] and tuple(block.gate.weight.shape) == (E, H)
    from types import SimpleNamespace

    block = Block()
    left = fold_gates(block, base_state.predictor, base_state.selection,
                      SimpleNamespace(enable_return_routed_experts=True))
    assert "--enable-return-routed-experts" in left[1]


def test_fold_setting():
    assert PluginConfig.from_env({}).fold is True
    assert PluginConfig.from_env({"BASE_FOLD": "off"}).fold is False
    with pytest.raises(ValueError, match="BASE_FOLD"):
        PluginConfig.from_env({"BASE_FOLD": "sometimes"})
    assert PluginConfig.from_env({}).moe == "auto"
    assert PluginConfig.from_env({"BASE_MOE": "Auto"}).moe == "auto"
    assert PluginConfig.from_env({"BASE_MOE": " SGLang "}).moe == "sglang"
    with pytest.raises(ValueError, match="BASE_MOE"):
        PluginConfig.from_env({"BASE_MOE": "ours"})
    assert PluginConfig.from_env({"BASE_ROUTE": "split", "BASE_SELECT_KERNEL": "two"}).fold is True
    assert PluginConfig.from_env({"BASE_ROUTE": "auto"}).fold is True  # auto: the measured rule
    with pytest.raises(ValueError, match="BASE_ROUTE"):
        PluginConfig.from_env({"BASE_ROUTE": "two"})
    with pytest.raises(ValueError, match="BASE_SELECT_KERNEL"):
        PluginConfig.from_env({"BASE_SELECT_KERNEL": "split"})


def test_weight_updates_load_the_router_half(base_state):
    block = Block(seed=5)
    fold_gates(block, base_state.predictor, base_state.selection)
    predictor_rows = block.gate.weight[E:].clone()
    new_router = torch.randn(E, H)
    block.gate.weight.weight_loader(block.gate.weight, new_router)  # as SGLang's weight updates call it
    torch.testing.assert_close(block.gate.weight[:E], new_router, rtol=0, atol=0)
    torch.testing.assert_close(block.gate.weight[E:], predictor_rows, rtol=0, atol=0)
    with pytest.raises(ValueError, match="BASE_FOLD=off"):
        block.gate.weight.weight_loader(block.gate.weight, torch.randn(2 * E, H))
