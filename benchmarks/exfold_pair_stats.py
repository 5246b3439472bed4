"""Issue 13 (base_fold): how much a fold can recover, from a predictor file's ExFold statistics.

    python benchmarks/exfold_pair_stats.py PREDICTOR.safetensors [...]

Per file: quantiles over (layer, source expert u) of the best sink's relative residual
min_q loss[u, q] (1 = the fold recovers nothing of E_u's output energy, 0 = all of it) and of that
sink's coefficient coef[u, q], plus the share of sources whose best residual is below 0.9 / 0.5.
A fold of expert u into q leaves loss[u, q] of u's (weighted) output energy; its best case is this
minimum, reached only when the best sink is in the kept set and not among the token's own slots.
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import load_file

QS = (0.1, 0.25, 0.5, 0.75, 0.9)


def stats(path: str) -> str:
    t = load_file(path)
    loss, coef = t["exfold_loss"].float(), t["exfold_coef"].float()  # [L, E, E]
    best, q = loss.min(-1)  # [L, E] the diagonal is 1e30, never the minimum
    c = coef.gather(-1, q.unsqueeze(-1)).squeeze(-1)  # [L, E]
    qs = torch.tensor(QS)
    lq = " ".join(f"{v:.3f}" for v in best.flatten().quantile(qs).tolist())
    cq = " ".join(f"{v:.3f}" for v in c.flatten().quantile(qs).tolist())
    return (f"| {path} | {loss.shape[0]} x {loss.shape[1]} | {lq} | {cq} | "
            f"{(best < 0.9).float().mean():.3f} | {(best < 0.5).float().mean():.3f} |")


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__.split("\n\n")[1])
    print("| predictor | layers x experts | best residual q10 q25 q50 q75 q90 | its coef q10 q25 q50 "
          "q75 q90 | share < 0.9 | share < 0.5 |")
    print("|---|---|---|---|---:|---:|")
    for p in argv:
        print(stats(p))


if __name__ == "__main__":
    main(sys.argv[1:])
