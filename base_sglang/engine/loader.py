"""Load a Hugging Face MoE checkpoint and its tokenizer from a local directory (no hub access)."""

from __future__ import annotations

from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return DTYPES[dtype]
    return torch.bfloat16 if device.type == "cuda" else torch.float32  # CPU matmuls: fp32 is fastest


def load_model(path: str | Path, device: torch.device, dtype: torch.dtype):
    """Return (model in eval mode on device, tokenizer). Raises FileNotFoundError naming the path."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model: no Hugging Face checkpoint at {path} (config.json missing)")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


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
