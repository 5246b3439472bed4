"""On a GPU: MoEPatch's Triton path (base_select_experts + fused_moe) against the torch path,
for the paper's BASE and the default base_plus."""

import pytest
import torch

from base_sglang.core import SelectionConfig
from base_sglang.hf import MoEPatch, decode_step
from base_sglang.testing.predictors import random_predictor


def _model_and_predictor():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                         moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, num_experts=32, num_experts_per_tok=4,
                         norm_topk_prob=True)
    model = Qwen3MoeForCausalLM(cfg).cuda().to(torch.bfloat16).eval()
    pred = random_predictor(32, 128, 4, (0, 1), seed=1, scale=0.05, bias_scale=0.1).to("cuda")
    return model, pred


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["base", "base_plus"])
@torch.inference_mode()
def test_triton_path_matches_the_torch_path(policy):
    model, pred = _model_and_predictor()
    x = torch.randint(0, 256, (24, 1), device="cuda")
    ref_dense = model(x).logits.float()
    results = {}
    for use_kernels in (False, True):
        patch = MoEPatch(model, SelectionConfig(policy=policy), pred, use_kernels=use_kernels)
        assert patch.use_kernels == use_kernels
        try:
            with decode_step(torch.full((24,), 32, device="cuda")):
                dense = model(x).logits.float()
            with decode_step(torch.full((24,), 5, device="cuda")) as step:
                small = model(x).logits.float()
            results[use_kernels] = (dense, small, {k: v.clone() for k, v in step.ids.items()})
        finally:
            patch.remove()
    for use_kernels, (dense, _small, ids) in results.items():
        assert torch.allclose(dense, ref_dense, atol=5e-2, rtol=5e-2), use_kernels
        for layer_ids in ids.values():
            assert len(set(layer_ids[layer_ids >= 0].tolist())) <= 5
    # layer 0 sees identical inputs on both paths, so the kernels must pick exactly the same experts
    assert torch.equal(results[True][2][0].long(), results[False][2][0].long())
    assert torch.allclose(results[True][1], results[False][1], atol=1e-1, rtol=1e-1)
    assert torch.isfinite(results[True][1]).all()
