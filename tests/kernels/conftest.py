"""Kernel tests run on the CPU through Triton's interpreter when there is no GPU.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it when the
kernels are decorated), so it is set here, at collection time of this folder.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
