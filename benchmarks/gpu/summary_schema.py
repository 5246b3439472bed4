"""The schema of benchmarks/results/sglang_h200/summary*.json (issue 11), and its validator.

    {"gpu": "...H200...", "sglang_version": "0.5.17", "torch": "...", "commit": "...",
     "model_shape": "qwen3-30b-a3b", "weights": "dummy", "cuda_graph": true,
     "routing": "uniform-random" | "skewed",
     "rows": [{"batch": 16, "budget": "dense" | "off" | int, "decode_tok_s": float,
               "experts_per_layer": float, "union_dense": float}, ...]}

Row budgets: "dense" and integers are decode steps with the plugin on (BASE_PREDICTOR set; "dense"
and any budget >= E keep the whole union: the hook runs, drops nothing); "off" rows come from a
second process with BASE_PREDICTOR unset (SGLang without BASE in its graphs). Extra top-level keys
(settings, timings, row_stats, ...) are allowed; the keys above and the row keys are exact.
A tensor-parallel summary (bench_tp.py, issue 17) adds "tp" (>= 2), "ranks_agree" and
"steps_compared": `validate_tp_summary`.
"""

from __future__ import annotations

import math

TOP_KEYS = {"gpu": str, "sglang_version": str, "torch": str, "commit": str, "model_shape": str,
            "weights": str, "cuda_graph": bool, "routing": str, "rows": list}
ROW_KEYS = ("batch", "budget", "decode_tok_s", "experts_per_layer", "union_dense")
ROUTINGS = ("uniform-random", "skewed")


def validate_summary(obj) -> None:
    """Raise ValueError naming the first field that breaks the schema."""
    if not isinstance(obj, dict):
        raise ValueError(f"summary: must be a JSON object, got {type(obj).__name__}")
    for key, kind in TOP_KEYS.items():
        if key not in obj:
            raise ValueError(f"summary: missing field {key!r}")
        if not isinstance(obj[key], kind):
            raise ValueError(f"{key}: must be {kind.__name__}, got {type(obj[key]).__name__}")
    if obj["routing"] not in ROUTINGS:
        raise ValueError(f"routing: must be one of {ROUTINGS}, got {obj['routing']!r}")
    if obj["cuda_graph"] is not True:
        raise ValueError("cuda_graph: must be true (decode steps replay CUDA graphs)")
    seen = set()
    for i, row in enumerate(obj["rows"]):
        validate_row(row, f"rows[{i}]")
        key = (row["batch"], row["budget"])
        if key in seen:
            raise ValueError(f"rows[{i}]: duplicate (batch, budget) {key}")
        seen.add(key)


def validate_row(row, where: str = "row") -> None:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: must be an object")
    if set(row) != set(ROW_KEYS):
        raise ValueError(f"{where}: keys must be exactly {list(ROW_KEYS)}, got {sorted(row)}")
    batch, budget = row["batch"], row["budget"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"{where}.batch: must be an integer >= 1, got {batch!r}")
    if budget not in ("dense", "off") and (isinstance(budget, bool) or not isinstance(budget, int)
                                           or budget < 1):
        raise ValueError(f"{where}.budget: must be 'dense', 'off' or an integer >= 1, "
                         f"got {budget!r}")
    for key in ("decode_tok_s", "experts_per_layer", "union_dense"):
        v = row[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}.{key}: must be a finite number >= 0, got {v!r}")
    if row["decode_tok_s"] <= 0:
        raise ValueError(f"{where}.decode_tok_s: must be > 0, got {row['decode_tok_s']!r}")
    if row["experts_per_layer"] > row["union_dense"] + 1e-6:
        raise ValueError(f"{where}: experts_per_layer {row['experts_per_layer']} exceeds the dense "
                         f"union {row['union_dense']} (selection only removes experts)")
    if isinstance(budget, int) and row["experts_per_layer"] > budget + 1e-6:
        raise ValueError(f"{where}: experts_per_layer {row['experts_per_layer']} exceeds the "
                         f"budget {budget}")


# ---- tensor parallel (bench_tp.py: benchmarks/results/sglang_h200_tp2/summary.json) ----------------
TP_KEYS = {"tp": int, "ranks_agree": bool, "steps_compared": int}


def validate_tp_summary(obj) -> None:
    """The single-GPU schema plus "tp" (>= 2), "ranks_agree" and "steps_compared": whether every
    rank kept the same experts and weights in every compared decode step (bench_tp.py)."""
    validate_summary(obj)
    for key, kind in TP_KEYS.items():
        if key not in obj:
            raise ValueError(f"summary: missing field {key!r}")
        v = obj[key]
        if isinstance(v, bool) is not (kind is bool) or not isinstance(v, kind):
            raise ValueError(f"{key}: must be {kind.__name__}, got {type(v).__name__}")
    if obj["tp"] < 2:
        raise ValueError(f"tp: must be >= 2 in a tensor-parallel summary, got {obj['tp']}")
    if obj["steps_compared"] < 0:
        raise ValueError(f"steps_compared: must be >= 0, got {obj['steps_compared']}")
    if obj["ranks_agree"] and obj["steps_compared"] == 0:
        raise ValueError("ranks_agree: true with steps_compared 0 (nothing was compared)")
