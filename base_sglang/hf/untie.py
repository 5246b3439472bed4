"""Write a copy of a checkpoint whose LM head is stored explicitly (tie_word_embeddings false).

SGLang's Qwen3-MoE (0.5.17 through 0.5.23) ignores `tie_word_embeddings`: a tied checkpoint (the
shipped proxy model is one) would run with an uninitialised LM head. The copy computes the same
function: lm_head.weight is the embedding matrix, saved as its own tensor.

    python -m base_sglang.hf.untie SRC_DIR DST_DIR
Only safetensors and json are used (no transformers), so it runs in any environment.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

EMBED, HEAD = "model.embed_tokens.weight", "lm_head.weight"


def is_tied(model_dir: str | Path) -> bool:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return bool(cfg.get("tie_word_embeddings", False))


def untie_embeddings(src: str | Path, dst: str | Path) -> Path:
    """Copy src to dst with lm_head.weight written out and tie_word_embeddings false."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file():
        raise FileNotFoundError(f"model: no config.json in {src}")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "config.json":
            shutil.copy2(f, dst / f.name)
    index_path = src / "model.safetensors.index.json"
    if index_path.is_file():  # sharded: the head in a shard of its own, named in the index
        index = json.loads(index_path.read_text())
        with safe_open(str(src / index["weight_map"][EMBED]), framework="pt") as f:
            head = f.get_tensor(EMBED).clone()
        save_file({HEAD: head.contiguous()}, str(dst / "lm_head.safetensors"),
                  metadata={"format": "pt"})
        index["weight_map"][HEAD] = "lm_head.safetensors"
        (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    else:  # one file: rewritten with the head in it
        with safe_open(str(src / "model.safetensors"), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        tensors[HEAD] = tensors[EMBED].clone()
        save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m base_sglang.hf.untie SRC_DIR DST_DIR", file=sys.stderr)
        return 2
    untie_embeddings(*args)
    print(f"wrote {args[1]} (lm_head.weight explicit, tie_word_embeddings false)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
