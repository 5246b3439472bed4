"""Shapes and builders shared by the plugin tests (a uniquely named module: `conftest` is taken
by every test folder, so importing names from it clashes when folders run in one process)."""

from __future__ import annotations

import torch

from base_sglang.core import Predictor
from base_sglang.testing.predictors import random_predictor

NUM_LAYERS, E, K, H = 2, 8, 2, 16  # tiny Qwen3-MoE-like shape: 2 MoE layers, 8 experts, top-2
DEFAULT_BUDGET = 5  # BASE_DEFAULT_BUDGET during the tests


def make_predictor(num_experts: int = E, seed: int = 0) -> Predictor:
    return random_predictor(num_experts, H, K, range(NUM_LAYERS), seed=seed, scale=0.5,
                            model_id="tiny-test")


def tiny_hf_config(num_experts: int = E):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=H, num_hidden_layers=NUM_LAYERS, num_experts=num_experts,
                          num_experts_per_tok=K, intermediate_size=32, moe_intermediate_size=8,
                          num_attention_heads=2, num_key_value_heads=1, vocab_size=64)


def model_runner(**overrides):
    """Stand-in for the few ModelRunner attributes the hooks read (a real one needs a GPU model).

    Everything the hooks *do* with it goes through the real sglang classes and the real hook code.
    """
    from types import SimpleNamespace

    fields = dict(is_draft_worker=False, max_running_requests=16, device="cpu")
    fields.update(overrides)
    return SimpleNamespace(**fields)


def forward_batch(mode, batch_size: int):
    """A real sglang ForwardBatch in the given ForwardMode (only the required fields set)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    z = torch.zeros(batch_size, dtype=torch.int64)
    return ForwardBatch(forward_mode=mode, batch_size=batch_size, input_ids=z, req_pool_indices=z,
                        seq_lens=z + 1, out_cache_loc=z, seq_lens_sum=batch_size)
