"""BASE_SELECTION_TRACE: what each tensor-parallel rank kept, per decode step and MoE layer.

Under tensor parallelism every rank runs the same TopK on the same all-reduced hidden state and
holds a slice of every expert; the ranks' expert outputs are summed by an all-reduce. So every rank
must keep exactly the same experts with exactly the same weights, or that sum adds partial outputs
of different experts. With BASE_SELECTION_TRACE=PREFIX each scheduler process appends one JSON line
per decode step to PREFIX.rank<R>.jsonl (R = its torch.distributed rank, 0 without one):

    {"step": 0, "rows": 11, "budgets": [8, 10, ...], "mode": "graph",
     "ids": ["<16 hex>", ...], "weights": ["<16 hex>", ...]}   # one digest per MoE layer slot

the digests of the bytes of the real rows' kept ids [rows, K] and weights [rows, K] (blake2b, dtype
included). `compare_traces` reads the ranks' files back and says whether they agree bit for bit.

For checks only: writing costs a host sync and a small device-to-host copy per decode step (unset,
nothing runs). Under CUDA graphs the hook's Python runs only at capture, so the trace holds on to the
selection tensors each captured graph writes (held, the graph pool cannot reuse them; every replay
of that graph overwrites them with its step's values) and reads those of the graph that ran: the
smallest captured batch >= the step's rows, as SGLang pads. Eager steps leave their own tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

ENV = "BASE_SELECTION_TRACE"
FIELDS = ("ids", "weights")  # per-layer digests
STEP_KEYS = ("step", "rows", "budgets", "mode")  # must match across ranks too


def selection_digest(ids: torch.Tensor, weights: torch.Tensor) -> tuple[str, str]:
    """Digests (16 hex digits each) of ids [T, K] and weights [T, K]: equal iff the bytes are."""
    return tensor_digest(ids), tensor_digest(weights)


def tensor_digest(t: torch.Tensor) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def trace_path(prefix: str, rank: int) -> Path:
    return Path(f"{prefix}.rank{rank}.jsonl")


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


class SelectionTrace:
    """The per-rank trace file and the selection tensors of the current step (see the module doc)."""

    def __init__(self, path: str | Path, num_slots: int):
        self.path = Path(path)
        self.num_slots = num_slots
        self.writing = True  # a benchmark pauses the writes (and their host syncs) around timed steps
        self.step = 0
        self.graph: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (rows, slot)
        self.eager: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # slot -> this step's tensors

    @classmethod
    def from_env(cls, num_slots: int, env=None) -> SelectionTrace | None:
        prefix = (os.environ if env is None else env).get(ENV)
        if not prefix:
            return None
        path = trace_path(prefix, _rank())
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")  # a fresh file per process start
        return cls(path, num_slots)

    def keep(self, slot: int, ids: torch.Tensor, weights: torch.Tensor) -> None:
        """In the TopK hook: this layer's selection, ids [n, K] and weights [n, K] (n padded rows)."""
        if _capturing(ids):
            self.graph[(ids.shape[0], slot)] = (ids, weights)
        else:
            self.eager[slot] = (ids, weights)

    def begin_step(self) -> None:
        self.eager.clear()

    def end_step(self, budgets: list[int]) -> None:
        """After a decode forward: append its digests (a host sync) unless writing is paused."""
        if not self.writing:
            return
        rows = len(budgets)
        mode = "eager" if self.eager else "graph"
        digests = {f: [None] * self.num_slots for f in FIELDS}
        for slot in range(self.num_slots):
            pair = self.eager.get(slot) if self.eager else self._graph_pair(slot, rows)
            if pair is not None:
                digests["ids"][slot], digests["weights"][slot] = selection_digest(
                    pair[0][:rows], pair[1][:rows])
        rec = {"step": self.step, "rows": rows, "budgets": list(budgets), "mode": mode, **digests}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.step += 1

    def _graph_pair(self, slot: int, rows: int):
        sizes = [n for (n, s) in self.graph if s == slot and n >= rows]
        return self.graph[(min(sizes), slot)] if sizes else None


# ---- reading the ranks' files back ------------------------------------------------------------------
def read_trace(path: str | Path) -> list[dict]:
    """The records of one rank's file; ValueError naming the file and line for a bad line."""
    out = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
        missing = [k for k in ("step", "rows", "budgets", *FIELDS) if k not in rec]
        if missing:
            raise ValueError(f"{path}:{i}: record lacks {missing}")
        out.append(rec)
    return out


def compare_traces(paths: list[str | Path], min_pairs_for_staleness: int = 10) -> dict:
    """Compare the ranks' traces step by step and layer by layer.

    Returns {"ranks_agree", "steps_compared", "layers", "mismatched_steps", "first_mismatch",
    "mismatch_counts" (per field), "steps_per_rank", "modes", "problems"}. ranks_agree is True only
    if every compared step agrees in step, rows, budgets, mode and every layer's digests, at
    least one step was compared, and nothing is wrong with the traces themselves (unequal step
    counts, layers with no selection recorded, or a layer whose ids digest never changes from one
    step to the next of the same batch size: a trace that read stale tensors would agree
    vacuously; every decode step feeds new tokens, so its selections change).
    """
    if len(paths) < 2:
        raise ValueError(f"paths: need the traces of at least 2 ranks, got {len(paths)}")
    traces = [read_trace(p) for p in paths]
    counts = [len(t) for t in traces]
    problems = []
    if len(set(counts)) > 1:
        problems.append(f"ranks wrote different numbers of steps: {counts}")
    n = min(counts)
    layers = len(traces[0][0]["ids"]) if n else 0
    mismatch_counts = dict.fromkeys((*STEP_KEYS, *FIELDS), 0)
    mismatched, first, missing = 0, None, 0
    for s in range(n):
        recs = [t[s] for t in traces]
        bad = []
        for key in STEP_KEYS:
            if any(r.get(key) != recs[0].get(key) for r in recs[1:]):
                bad.append((key, None))
        for f in FIELDS:
            for layer in range(layers):
                vals = [r[f][layer] for r in recs]
                if any(v is None for v in vals):
                    missing += 1
                elif any(v != vals[0] for v in vals[1:]):
                    bad.append((f, layer))
        for key in {k for k, _ in bad}:
            mismatch_counts[key] += 1
        if bad:
            mismatched += 1
            if first is None:
                key, layer = bad[0]
                first = {"step": recs[0]["step"], "field": key, "layer": layer,
                         "values": [r.get(key) if layer is None else r[key][layer] for r in recs]}
    if missing:
        problems.append(f"{missing} (step, layer, field) entries recorded no selection")
    stale = _stale_layers(traces[0][:n], layers, min_pairs_for_staleness)
    if stale:
        problems.append(f"ids digests never change between consecutive steps of the same batch in "
                        f"layers {stale[:8]}{' ...' if len(stale) > 8 else ''}: the trace read "
                        "stale tensors")
    modes: dict[str, int] = {}
    for rec in traces[0][:n]:
        modes[rec.get("mode", "?")] = modes.get(rec.get("mode", "?"), 0) + 1
    return {"ranks_agree": n > 0 and mismatched == 0 and not problems, "steps_compared": n,
            "layers": layers, "mismatched_steps": mismatched, "first_mismatch": first,
            "mismatch_counts": mismatch_counts, "steps_per_rank": counts, "modes": modes,
            "problems": problems, "files": [str(p) for p in paths]}


def _stale_layers(recs: list[dict], layers: int, min_pairs: int) -> list[int]:
    """Layers whose ids digest is the same in every pair of consecutive steps with equal rows
    (checked when there are at least min_pairs such pairs)."""
    pairs = [(a, b) for a, b in zip(recs, recs[1:]) if a["rows"] == b["rows"]]
    if len(pairs) < min_pairs:
        return []
    return [layer for layer in range(layers)
            if all(a["ids"][layer] == b["ids"][layer] for a, b in pairs)]
