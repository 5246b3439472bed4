"""Calibration settings: one frozen dataclass; the CLI reads its defaults from here."""

from __future__ import annotations

from dataclasses import dataclass, field

SERE_METRICS = ("frobenius", "cosine")


@dataclass(frozen=True)
class CalibrationConfig:
    """What `base-calibrate` does (defaults: algorithms.md section 9).

    num_seqs, seq_len : calibration sequences (SERE/BASE setting: 400 x 128 tokens).
    batch_size        : sequences per forward pass (memory knob, not a statistic).
    ridge             : lambda = ridge * tr(Z^T Z) / d per (layer, expert); the bias is not penalised.
    heldout_every     : every n-th calibration document is held out of the fit and scores it (fit_stats).
    stat_batch        : decode-batch size B used for the held-out retained-energy statistics.
    stat_budgets      : budgets M for those statistics (default: k, 2k, 3k, 4k below the expert count).
    sere_tokens       : tokens on which every expert is run for the SERE similarity (SERE: 200 x 64).
    sere_metric       : "frobenius" (SERE's Qwen3 setting) or "cosine".
    exfold_lambda     : ExFold's ridge term in coef = sum w<u,v> / (sum w|v|^2 + lambda).
    max_stats_gib     : cap on the fp64 sufficient statistics held at once; layers are split into
                        groups (one pass over the data per group) when the model needs more.
    """

    num_seqs: int = 400
    seq_len: int = 128
    batch_size: int = 8
    ridge: float = 1e-3
    heldout_every: int = 10
    stat_batch: int = 16
    stat_budgets: tuple[int, ...] = field(default_factory=tuple)
    sere_tokens: int = 12800
    sere_metric: str = "frobenius"
    exfold_lambda: float = 1e-3
    max_stats_gib: float = 4.0

    def __post_init__(self):
        for name in ("num_seqs", "seq_len", "batch_size", "stat_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len: must be >= 2, got {self.seq_len}")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every: must be >= 2, got {self.heldout_every}")
        if self.ridge < 0 or self.exfold_lambda < 0:
            raise ValueError("ridge and exfold_lambda: must be >= 0")
        if self.sere_tokens < 0:
            raise ValueError(f"sere_tokens: must be >= 0, got {self.sere_tokens}")
        if self.sere_metric not in SERE_METRICS:
            raise ValueError(f"sere_metric: must be one of {SERE_METRICS}, got {self.sere_metric!r}")
        if self.max_stats_gib <= 0:
            raise ValueError(f"max_stats_gib: must be > 0, got {self.max_stats_gib}")
        if any(m < 1 for m in self.stat_budgets):
            raise ValueError(f"stat_budgets: must be >= 1, got {self.stat_budgets}")
        object.__setattr__(self, "stat_budgets", tuple(int(m) for m in self.stat_budgets))

    def budgets_for(self, num_experts: int, top_k: int) -> tuple[int, ...]:
        if self.stat_budgets:
            return tuple(m for m in self.stat_budgets if m < num_experts)
        return tuple(m for m in (top_k, 2 * top_k, 3 * top_k, 4 * top_k) if m < num_experts)


def run_cli(prog: str, run, args) -> int:
    """Run a CLI body with args.threads torch threads; a ValueError / missing file is a clean
    `prog: error: ...` and exit code 2 (the message names the field)."""
    import sys

    import torch

    threads = torch.get_num_threads()
    try:
        if args.threads > 0:
            torch.set_num_threads(args.threads)
        return run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    finally:
        torch.set_num_threads(threads)
