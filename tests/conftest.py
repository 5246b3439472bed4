"""Shared fixtures: seeding, the gpu marker, and a clean MoE-hook context for every test."""

import os

import pytest
import torch

# kernels: without a GPU, tests/kernels run Triton on its CPU interpreter; the variable must be set
# before anything imports triton (transformers' model classes do), so it is set here, first.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_report_header(config):
    import transformers

    return f"base-sglang under torch {torch.__version__}, transformers {transformers.__version__}"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_and_reset():
    torch.manual_seed(0)
    from base_sglang import hf

    hf.reset_step()
    yield
    hf.reset_step()
