"""MoEPatch owns the expert computation of every slot it changes, and refuses experts it does not know.

The budgets-below-top-k bug came from handing transformers' experts implementation a sentinel id
it only zeroes under expert parallelism (transformers 5.19). These tests make the library strict
(it raises on any id outside [0, E)), so a regression fails deterministically, not only when
uninitialised memory happens to hold NaN.
"""

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from base_sglang.core import SelectionConfig, moe_forward_ref
from base_sglang.hf import MoEPatch, decode_step, find_moe_blocks
from base_sglang.testing.predictors import random_predictor

E, K, H, LAYERS = 16, 4, 32, 3


@pytest.fixture()
def model():
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=H, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=LAYERS, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True)
    return Qwen3MoeForCausalLM(cfg).eval()


def predictor():
    return random_predictor(E, H, K, range(LAYERS), seed=1)


def make_library_strict(model):
    """The experts' own forward raises on ids it was not written for (what a new release may do)."""
    seen = []
    for block in find_moe_blocks(model).values():
        original = block.experts.forward

        def strict(hidden, ids, weights, _orig=original):
            bad = (ids < 0) | (ids >= E)
            if bad.any():
                raise AssertionError(f"library experts got ids outside [0, {E}): {ids[bad]}")
            seen.append(ids.shape)
            return _orig(hidden, ids, weights)

        block.experts.forward = strict
    return seen


@torch.inference_mode()
@pytest.mark.parametrize("M", [1, 2, 3, 8])
def test_changed_routing_never_reaches_the_library(model, M):
    x = torch.randint(0, 128, (12, 1))
    seen = make_library_strict(model)
    patch = MoEPatch(model, SelectionConfig(policy="base"), predictor())
    try:
        with decode_step(torch.full((12,), M)) as step:
            out = model(x).logits
        assert torch.isfinite(out).all()
        for layer, ids in step.ids.items():
            assert (ids < 0).any() == (M < K), layer  # below top-k some slots are dropped
            assert len(set(ids[ids >= 0].tolist())) <= M
        seen.clear()
        with decode_step(torch.full((12,), E), skip_selection=True):
            dense = model(x).logits  # unchanged routing: the library's own path
        assert len(seen) == LAYERS
        torch.testing.assert_close(dense, model(x).logits, rtol=0, atol=0)
    finally:
        patch.remove()


@torch.inference_mode()
def test_dropped_slots_contribute_nothing(model):
    """A decode step's MoE output equals moe_ref over exactly the kept (id, weight) pairs."""
    blocks = find_moe_blocks(model)
    got = {}
    for layer, block in blocks.items():
        block.register_forward_hook(lambda m, a, o, layer=layer: got.__setitem__(layer, (a[0], o)))
    patch = MoEPatch(model, SelectionConfig(policy="base"), predictor())
    x = torch.randint(0, 128, (10, 1))
    with decode_step(torch.full((10,), 2)) as step:
        model(x)
    patch.remove()
    for layer, block in blocks.items():
        hidden, out = got[layer]
        h = hidden.reshape(-1, H)
        logits, w, ids = block.gate(h)  # the router's own choice, to recover the kept weights
        kept = step.ids[layer]
        assert (kept < 0).any()
        # the weights that went with the kept ids: rerun the selection the patch ran
        from base_sglang.core import select_experts

        sel = select_experts(logits, ids, w, h, torch.full((10,), 2), layer,
                             SelectionConfig(policy="base"), predictor())
        assert torch.equal(sel.ids, kept)
        ex = block.experts
        ref = moe_forward_ref(h, sel.ids, sel.weights, ex.gate_up_proj, ex.down_proj, ex.act_fn)
        torch.testing.assert_close(out.reshape(-1, H), ref)


def test_experts_that_compute_something_else_are_refused(model):
    blocks = find_moe_blocks(model)
    first = next(iter(blocks.values())).experts
    original = first.forward
    first.forward = lambda h, i, w: 2 * original(h, i, w)
    with pytest.raises(ValueError, match="Qwen3MoeExperts.*disagrees with base_sglang's expert path"):
        MoEPatch(model, SelectionConfig(policy="dense"))
    first.forward = original
    first.is_transposed = True
    with pytest.raises(ValueError, match="is_transposed"):
        MoEPatch(model, SelectionConfig(policy="dense"))


def test_untied_copy_computes_the_same_model(tmp_path):
    """hf.untie: the LM head stored explicitly (for SGLang, which ignores tie_word_embeddings)."""
    from transformers import AutoModelForCausalLM

    from base_sglang.hf.untie import is_tied, untie_embeddings
    from base_sglang.testing.models import create_tiny_moe

    src = create_tiny_moe(tmp_path / "src", num_layers=1)
    cfg = AutoModelForCausalLM.from_pretrained(src).config
    cfg.tie_word_embeddings = True
    tied = AutoModelForCausalLM.from_config(cfg).eval()
    tied.save_pretrained(tmp_path / "tied")
    dst = untie_embeddings(tmp_path / "tied", tmp_path / "untied")
    assert is_tied(tmp_path / "tied") and not is_tied(dst)
    untied = AutoModelForCausalLM.from_pretrained(dst).eval()
    assert untied.lm_head.weight.data_ptr() != untied.model.embed_tokens.weight.data_ptr()
    x = torch.randint(0, cfg.vocab_size, (2, 7))
    with torch.no_grad():
        assert torch.equal(AutoModelForCausalLM.from_pretrained(tmp_path / "tied").eval()(x).logits,
                           untied(x).logits)


@torch.inference_mode()
def test_error_targeted_decode_step(model):
    """decode_step(max_error=...) runs the core's error-targeted budgets: bound 0 keeps the dense
    routing, bound 1 lets every layer keep one expert, a mixed batch takes the largest request."""
    x = torch.randint(0, 128, (6, 1))
    dense = model(input_ids=x).logits
    patch = MoEPatch(model, SelectionConfig(policy="base_plus"), predictor(), use_kernels=False)
    try:
        with decode_step(torch.full((6,), E), max_error=torch.zeros(6)) as step:
            out = model(input_ids=x).logits
        assert torch.allclose(out, dense, atol=1e-5)
        assert all(int(s.num_kept) == int(s.num_union) for s in step.stats.values())
        with decode_step(torch.full((6,), E), max_error=torch.ones(6)) as step:
            model(input_ids=x)
        assert all(int(s.num_kept) == 1 for s in step.stats.values())
        budget = torch.tensor([E, E, E, E, E, 3])
        bound = torch.tensor([1.0, 1, 1, 1, 1, float("nan")])  # the last row asks for 3 experts
        with decode_step(budget, max_error=bound) as step:
            model(input_ids=x)
        assert all(int(s.num_kept) == 3 for s in step.stats.values())
    finally:
        patch.remove()
