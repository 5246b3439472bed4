"""Launcher helpers shared by the kernels: interpreter detection and contract checks."""

from __future__ import annotations

import os

import torch

ID_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def is_interpreter() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch (sm90+): each kernel waits on its predecessor with
    griddepcontrol.wait and lets the next one launch early, hiding launch gaps in a decode chain.
    BASE_PDL=0 turns it off; never under the interpreter."""
    if is_interpreter() or device.type != "cuda" or os.environ.get("BASE_PDL", "1") == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_kwargs(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


def check(cond: bool, msg: str) -> None:
    """Contract check that survives `python -O` (unlike assert)."""
    if not cond:
        raise ValueError(msg)


def check_tensor(name: str, t: torch.Tensor, shape: tuple, dtypes: tuple, device: torch.device,
                 contiguous: bool = True) -> None:
    check(tuple(t.shape) == tuple(shape), f"{name}: shape {tuple(t.shape)}, expected {tuple(shape)}")
    check(t.dtype in dtypes, f"{name}: dtype {t.dtype}, expected one of {dtypes}")
    check(t.device == device, f"{name}: on {t.device}, expected {device}")
    if contiguous:
        check(t.is_contiguous(), f"{name}: must be contiguous (strides {t.stride()})")
