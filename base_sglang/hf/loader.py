"""Load a local Hugging Face MoE checkpoint and its tokenizer (no hub access)."""

from __future__ import annotations

from pathlib import Path

import torch

from .families import check_family

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    """"auto" -> cuda when available, else cpu; cpu, cuda, cuda:N as given (cuda must exist)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda") and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"device: must be auto, cpu, cuda or cuda:N, got {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """"auto" -> bfloat16 on CUDA, float32 on the CPU (its matmuls are fastest in fp32)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype: must be auto or one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def load_model(path: str | Path, device: str | torch.device = "auto",
               dtype: str | torch.dtype = "auto"):
    """(model in eval mode, tokenizer) of a supported MoE family. Raises FileNotFoundError or
    ValueError naming the field."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model: no Hugging Face checkpoint at {path} (config.json missing)")
    check_family(AutoConfig.from_pretrained(path, local_files_only=True))
    dev = device if isinstance(device, torch.device) else resolve_device(device)
    dtype = dtype if isinstance(dtype, torch.dtype) else resolve_dtype(dtype, dev)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(dev).eval(), tokenizer


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends generation: the generation config's eos ids plus the tokenizer's."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for v in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(v, int):
            ids.add(v)
        elif v is not None:
            ids.update(int(x) for x in v)
    return ids
