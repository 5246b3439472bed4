"""The core plugged into a tiny random transformers Qwen3MoeForCausalLM."""

import pytest
import torch
from core_helpers import make_predictor

from base_sglang.core import SelectionConfig
from base_sglang.hf import MoEPatch, decode_step

E, K, H = 16, 4, 32


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=H, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=E, num_experts_per_tok=K, norm_topk_prob=True)
    return Qwen3MoeForCausalLM(cfg).eval()


@torch.inference_mode()
def test_dense_policy_leaves_logits_unchanged(model):
    x = torch.randint(0, 128, (10, 1))
    ref = model(x).logits
    patch = MoEPatch(model, SelectionConfig(policy="dense"))
    try:
        with decode_step(torch.full((10,), 3)) as step:
            out = model(x).logits
        assert torch.equal(ref, out)
        assert sorted(step.stats) == [0, 1, 2]
        out_plain = model(x).logits  # outside a decode step the blocks are untouched
        assert torch.equal(ref, out_plain)
    finally:
        patch.remove()


@torch.inference_mode()
@pytest.mark.parametrize("M", [1, 3, 6])
def test_base_never_executes_more_than_m_experts(model, M):
    pred = make_predictor(E, H, K, layers=(0, 1, 2))
    x = torch.randint(0, 128, (16, 1))
    ref = model(x).logits
    patch = MoEPatch(model, SelectionConfig(policy="base"), pred)
    try:
        with decode_step(torch.full((16,), M)) as step:
            out = model(x).logits
        for layer in (0, 1, 2):
            ids = step.ids[layer]
            assert len(set(ids[ids >= 0].tolist())) <= M
            assert int(step.stats[layer].num_kept) <= M
            assert int(step.stats[layer].num_union) > M
        assert not torch.equal(ref, out)
        with decode_step(torch.full((16,), E)):  # nothing dropped: our expert path, same function
            torch.testing.assert_close(model(x).logits, ref, rtol=1e-5, atol=1e-6)
    finally:
        patch.remove()


def test_predictor_is_validated_against_the_model(model):
    from base_sglang.core import PredictorMismatch

    with pytest.raises(PredictorMismatch, match="num_experts"):
        MoEPatch(model, SelectionConfig(), make_predictor(E + 1, H, K, layers=(0, 1, 2)))


def test_decode_steps_do_not_nest():
    with decode_step(torch.ones(1)):
        with pytest.raises(RuntimeError, match="nested"):
            with decode_step(torch.ones(1)):
                pass
