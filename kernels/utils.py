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


_NUM_SMS: dict[str, int] = {}


def num_sms(device: torch.device) -> int:
    """Multiprocessors of the device (the persistent grids' size); 4 under the CPU interpreter, so
    the tests run several items per program."""
    if device.type != "cuda" or is_interpreter():
        return 4
    key = str(device)
    if key not in _NUM_SMS:
        _NUM_SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _NUM_SMS[key]


_L2: dict[str, int] = {}


def l2_bytes(device: torch.device) -> int:
    """L2 cache size of the device (50 MB when there is no CUDA device)."""
    if device.type != "cuda":
        return 50 << 20
    key = str(device)
    if key not in _L2:
        _L2[key] = torch.cuda.get_device_properties(device).L2_cache_size
    return _L2[key]


def launch_kwargs(pdl: bool) -> dict:
    return {"launch_pdl": True} if pdl else {}


_TICKETS: dict[tuple, torch.Tensor] = {}


def ticket_buffer(device: torch.device) -> torch.Tensor:
    """A zeroed int32 counter per (device, current stream) for "the last program selects" kernels.

    The kernel that draws tickets resets the counter to 0 before it exits, so it stays zeroed
    between calls and graph replays; launches on one stream are serialised (under PDL every ticket
    is drawn after the previous grid completed). Under graph capture without an eager call on the
    capturing stream first, a fresh counter is zeroed inside the graph (one memset node per call)
    and not cached: warm up on the capture stream, as SGLang does, to keep the graph memset-free.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _TICKETS.get(key)
    if buf is None:
        buf = torch.zeros(1, dtype=torch.int32, device=device)
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _TICKETS[key] = buf
    return buf


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


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
