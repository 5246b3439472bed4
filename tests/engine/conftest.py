"""A tiny random Qwen3-MoE checkpoint (8 experts, top-2, 2 layers, hidden 64, ~530-token BPE vocab,
random predictor) built once per session in a temp dir, and an engine on it."""

import pytest
import torch

from base_sglang.engine import EngineConfig, LLMEngine
from base_sglang.testing.models import create_tiny_moe


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    torch.set_num_threads(1)  # tiny matmuls: one thread avoids OpenMP spin on a busy 2-core box
    return create_tiny_moe(tmp_path_factory.mktemp("tiny-qwen3-moe"))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(EngineConfig(model=str(tiny_model_dir), policy="base", max_running_requests=8,
                                  max_waiting_requests=8))
