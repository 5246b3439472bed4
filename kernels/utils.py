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


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of the device (132 when there is no CUDA device)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


BAR_BITS = 20  # one launch moves every barrier entry by 2^20: at most 2^20 - 1 arrivals per entry
_BARRIERS: dict[tuple, torch.Tensor] = {}


def barrier_buffer(device: torch.device, n: int = 1) -> torch.Tensor:
    """The [n] int32 counters of a grid barrier (base_fused: one; moe_one: one per launch shape's
    flags), one buffer per (device, current stream, n), zeroed once.

    Kernels move every entry by exactly 2^BAR_BITS per launch and read their launch from their own
    arrival, so it is never reset: no memset per call, in eager calls or graph replays. Launches on
    one stream are serialised; concurrent streams get their own counters. A buffer made during graph
    capture is not cached (it belongs to the graph's memory pool, and its zeroing is a graph node):
    warm up on the capture stream, as SGLang does.
    """
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream, n)
    buf = _BARRIERS.get(key)
    if buf is None:
        buf = torch.zeros(n, dtype=torch.int32, device=device)  # multiples of 2^BAR_BITS
        if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
            _BARRIERS[key] = buf
    return buf


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


def check_moe_inputs(hidden, ids, weights, gate_up, down) -> tuple[int, int, int, int, int]:
    """The contract of an expert-skipping MoE call (fused_moe, moe_one) -> (T, H, E, I, K):
    hidden [T, H] bf16/fp16 with unit column stride; gate_up [E, 2I, H], down [E, H, I]
    contiguous in hidden's dtype; ids [T, K] int32/int64, weights [T, K] float, on its device."""
    check(hidden.dim() == 2 and hidden.dtype in (torch.bfloat16, torch.float16)
          and hidden.stride(1) == 1,
          f"hidden: needs [T, H] bf16/fp16 with unit column stride, got {tuple(hidden.shape)} "
          f"{hidden.dtype} {hidden.stride()}")
    T, H = hidden.shape
    check(gate_up.dim() == 3 and ids.dim() == 2,
          f"gate_up, ids: expected [E, 2I, H] and [T, K], got {tuple(gate_up.shape)}, {tuple(ids.shape)}")
    E, two_i, _ = gate_up.shape
    I, K, dev = two_i // 2, ids.shape[1], hidden.device  # noqa: E741
    check_tensor("gate_up", gate_up, (E, 2 * I, H), (hidden.dtype,), dev)
    check_tensor("down", down, (E, H, I), (hidden.dtype,), dev)
    check_tensor("ids", ids, (T, K), ID_DTYPES, dev, contiguous=False)
    check_tensor("weights", weights, (T, K), FLOAT_DTYPES, dev, contiguous=False)
    return T, H, E, I, K
