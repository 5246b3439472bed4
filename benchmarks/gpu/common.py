"""Shared pieces of the SGLang-on-GPU scripts (bench_decode, check_proxy_sglang, check_server_sglang).

    QWEN3_30B_A3B            the Qwen3-30B-A3B config.json (shape only: the runs use dummy weights)
    write_dummy_model_dir    config.json + a full-vocabulary synthetic tokenizer, for --load-format dummy
    make_synthetic_predictor a BASE predictor file of the right shape with random weights
    run_info                 GPU, torch, sglang, commit: the header of every result file
    write_json / update_json atomic JSON writes (results are rewritten as a run goes)

CPU-only and free of SGLang imports, so tests/benchmarks can exercise all of it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # base_sglang from the checkout when it is not installed
    sys.path.append(str(REPO))
PROXY_DIR = REPO / "base_sglang" / "models" / "proxy-moe"

# Qwen/Qwen3-30B-A3B's config.json (the fields SGLang's Qwen3MoeForCausalLM reads).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def split_sglang_args(argv) -> tuple[list[str], list[str]]:
    """(this script's arguments, the ones after `--`, which go to SGLang's ServerArgs unchanged)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def write_dummy_model_dir(path: str | Path, config: dict | None = None) -> Path:
    """A model dir for `--load-format dummy`: config.json and a word-level tokenizer over the whole
    vocabulary (token i is the word "t<i>"), so that every id a dummy model samples decodes to text
    and re-encodes to the same id (bench_serving counts tokens by decoding them). Idempotent."""
    config = dict(QWEN3_30B_A3B if config is None else config)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg_file = path / "config.json"
    if cfg_file.is_file() and json.loads(cfg_file.read_text()) == config \
            and (path / "tokenizer.json").is_file():
        return path
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    tok = Tokenizer(WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))
    eos = config.get("eos_token_id")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0",
        "eos_token": f"t{eos}" if isinstance(eos, int) else None, "pad_token": "t0",
        "model_max_length": config.get("max_position_embeddings", 4096),
        "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE}, indent=1))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    cfg_file.write_text(json.dumps(config, indent=1))
    return path


def make_synthetic_predictor(config: dict, path: str | Path, seed: int = 0,
                             weight_std: float = 0.02, bias_std: float = 1.0) -> Path:
    """A predictor file (base_sglang/core/predictor.py format) for this model config, random weights.

    It exercises the whole BASE path (score, batch ranking, top-M, backfill) at full cost; the
    experts it keeps are arbitrary, which a speed benchmark on dummy weights does not care about."""

    from base_sglang.core.predictor import describe_model_config
    from base_sglang.testing.predictors import random_predictor

    shape = describe_model_config(config)
    layers, num_e, hidden = shape["moe_layers"], shape["num_experts"], shape["hidden_size"]
    if not layers or not num_e or not hidden:
        raise ValueError(f"config: not a MoE model config (moe_layers={layers}, "
                         f"num_experts={num_e}, hidden_size={hidden})")
    pred = random_predictor(
        num_e, hidden, shape["top_k"], layers, num_layers=shape["num_layers"], seed=seed,
        scale=weight_std, bias_scale=bias_std, model_id="synthetic",
        architecture=(config.get("architectures") or [config.get("model_type", "")])[0],
        norm_topk_prob=bool(config.get("norm_topk_prob", True)),
        calibration={"synthetic": True, "seed": seed,
                     "note": "random weights: routes the BASE path, predicts nothing"})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pred.save(path)
    return path


def commit() -> str:
    if os.environ.get("BASE_COMMIT"):
        return os.environ["BASE_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                              capture_output=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_info() -> dict:
    """GPU name, library versions and the commit (no SGLang import: reads its metadata)."""
    from importlib import metadata

    import torch

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (cpu)"
    return {"gpu": gpu, "sglang_version": version("sglang"), "torch": torch.__version__,
            "triton": version("triton"), "transformers": version("transformers"),
            "sgl_kernel": version("sglang-kernel") or version("sgl-kernel"),
            "python": platform.python_version(), "commit": commit()}


def write_json(path: str | Path, obj) -> None:
    """Write atomically (a reader never sees half a file; a killed run leaves the last version)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=_jsonable) + "\n")
    os.replace(tmp, path)


def update_json(path: str | Path, update) -> dict:
    """Read the JSON object at path ({} if absent), apply update(obj) in place, write it back."""
    path = Path(path)
    obj = json.loads(path.read_text()) if path.is_file() else {}
    update(obj)
    write_json(path, obj)
    return obj


def _jsonable(x):
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def format_table(headers: list[str], rows: list[list]) -> str:
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = lambda r: "  ".join(v.rjust(w) for v, w in zip(r, widths))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


class Clock:
    """Wall-clock phases of a run (printed, and stored in the result files)."""

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> float:
        now = time.perf_counter()
        self.phases[name] = round(now - self.last, 2)
        self.last = now
        print(f"[time] {name}: {self.phases[name]:.1f} s (total {now - self.start:.1f} s)",
              flush=True)
        return self.phases[name]

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def main(argv=None) -> int:
    """`python3 benchmarks/gpu/common.py prepare --model-dir DIR [--predictor FILE]`: the dummy
    Qwen3-30B-A3B model dir and a synthetic predictor for it (what the GPU scripts use)."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("command", choices=("prepare",))
    p.add_argument("--model-dir", required=True)
    p.add_argument("--predictor")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    model_dir = write_dummy_model_dir(args.model_dir)
    print(f"model dir: {model_dir}")
    if args.predictor:
        if not Path(args.predictor).is_file():
            config = json.loads((model_dir / "config.json").read_text())
            make_synthetic_predictor(config, args.predictor, seed=args.seed)
        print(f"predictor: {args.predictor}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
