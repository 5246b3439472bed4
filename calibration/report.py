"""Evaluation outputs: a printed table, JSON, CSV and a Pareto plot (quality vs experts executed)."""

from __future__ import annotations

import csv
import json
import math
import platform
import subprocess
from pathlib import Path

import torch

COLUMNS = ("setting", "policy", "knob", "value", "experts", "union", "nll", "ppl", "dnll", "dnll_se",
           "dppl_pct", "agree", "kl", "energy", "tokens", "seconds")
STYLE = {"base_plus": ("tab:red", "o", "-"), "oracle_plus": ("gray", "*", "--"),
         "base_plus_err": ("darkred", "h", ":"),
         "base": ("tab:pink", "o", "-"), "oracle": ("black", "*", "--"), "gate_sum": ("tab:blue", "s", "-"),
         "frequency": ("tab:green", "^", "-"), "exfold": ("tab:purple", "D", "-"),
         "oea": ("tab:orange", "v", ":"), "sere": ("tab:brown", "P", ""), "lynx": ("tab:cyan", "X", "")}


def environment() -> dict:
    def git(*a):
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True, timeout=10,
                                  cwd=Path(__file__).resolve().parent).stdout.strip()
        except OSError:
            return ""

    cpu = ""
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                    if ln.startswith("model name")), "")
    except OSError:
        pass
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:
        tf_version = ""
    return {"commit": git("rev-parse", "--short", "HEAD"), "dirty": bool(git("status", "--porcelain",
            "--untracked-files=no")), "cpu": cpu or platform.processor(), "gpu": dev,
            "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": tf_version,
            "python": platform.python_version()}


def table(rows: list[dict]) -> str:
    head = (f"{'setting':24} {'experts':>7} {'union':>6} {'ppl':>8} {'dppl%':>7} {'agree':>6} "
            f"{'KL':>7} {'energy':>7}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['setting']:24} {r['experts']:7.2f} {r['union']:6.2f} {r['ppl']:8.3f} "
                     f"{r['dppl_pct']:7.2f} {r['agree']:6.3f} {r['kl']:7.4f} {r['energy']:7.4f}")
    return "\n".join(lines)


OUTPUT_SUFFIXES = (".json", ".csv", ".png", ".safetensors")


def stem_path(out: str | Path, suffix: str) -> Path:
    """An output stem with `suffix`: a stem ending in one of OUTPUT_SUFFIXES has it replaced, any
    other is extended ("run_tau0.05" -> "run_tau0.05.json", not "run_tau0.json")."""
    out = Path(out)
    return out.with_suffix(suffix) if out.suffix in OUTPUT_SUFFIXES else out.with_name(out.name + suffix)


def write_outputs(out: str | Path, rows: list[dict], meta: dict, checks: dict) -> list[Path]:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem_path(out, ".json"), stem_path(out, ".csv")]
    with open(paths[0], "w") as f:
        json.dump({"meta": meta, "rows": rows, "checks": checks}, f, indent=1, default=_jsonable)
    with open(paths[1], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    png = plot(stem_path(out, ".png"), rows, meta)
    return paths + ([png] if png else [])


def tokens_path(out: str | Path) -> Path:
    """Where the per-token increases of a result stem (or its .json) live: STEM.tokens.safetensors."""
    return stem_path(out, ".tokens.safetensors")


def write_tokens(out: str | Path, tokens: dict[str, torch.Tensor]) -> Path:
    """The per-token NLL increase of every setting (name -> [N] float32), so that any two settings
    can be compared token by token later (sweep.add_paired). Not committed: about 16 KB per setting
    of 4,096 tokens (git-ignored; the paired z it gives is stored in the JSON's checks)."""
    from safetensors.torch import save_file

    path = tokens_path(out)
    save_file({k: v.float().contiguous() for k, v in tokens.items()}, str(path))
    return path


def read_tokens(out: str | Path) -> dict[str, torch.Tensor] | None:
    """write_tokens' arrays (float64) next to a result, or None where the run did not keep them."""
    path = tokens_path(out)
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    return {k: v.double() for k, v in load_file(str(path)).items()}


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


def plot(path: Path, rows: list[dict], meta: dict) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib)")
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))
    dense = next((r for r in rows if r["policy"] == "dense"), None)
    for policy, (color, marker, ls) in STYLE.items():
        pts = sorted((r["experts"], r["dppl_pct"], r["energy"]) for r in rows if r["policy"] == policy)
        if not pts:
            continue
        x, y, e = zip(*pts)
        axes[0].plot(x, [max(v, 1e-3) for v in y], marker=marker, ls=ls or "none", color=color,
                     label=policy, ms=6)
        axes[1].plot(x, e, marker=marker, ls=ls or "none", color=color, label=policy, ms=6)
    for ax in axes:
        if dense is not None:
            ax.axvline(dense["union"], color="gray", ls=":", lw=1)
        ax.set_xlabel("experts executed per MoE layer per step")
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("perplexity increase vs dense (%)")
    axes[1].set_ylabel("retained removal energy (true norms)")
    axes[0].legend(fontsize=8)
    s = meta.get("settings", {})
    fig.suptitle(f"{meta.get('model', '')}: B={s.get('batch_size')}, prefix {s.get('prefix')}, "
                 f"{s.get('steps')} steps x {s.get('num_batches')} batches (dotted: dense union)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
