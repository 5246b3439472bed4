"""Documents in, token windows out: reading .txt/.jsonl, the calibration/tuning/reporting split, windows.

Document boundaries
  .jsonl : one JSON object per line with a "text" field (or "content").
  .txt   : documents separated by a line that is exactly <|endoftext|> or <|doc|>, or introduced by a
           source header line <<<name>>>; a file with no separator is cut into ~4000-character pieces
           at blank lines.

Split (deterministic, content-addressed): a document belongs to the evaluation half when
    int(sha1(text)[:8 bytes]) % 100 < eval_percent        (default 50)
and to the calibration half otherwise, so `base-calibrate` never sees the documents `base-eval` scores,
whatever order the file lists them in. The evaluation half is split again, by the next 8 bytes of the
same hash, into a tuning part and a reporting part:
    tune   : eval documents with int(sha1(text)[8:16 bytes]) % 100 < tune_percent   (default 30)
    report : the other eval documents
Policy knobs are chosen on `tune`; the published tables score `report` (base-eval's default), which no
choice was made on.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

SPLITS = ("calib", "eval", "tune", "report", "all")
DEFAULT_EVAL_PERCENT = 50
DEFAULT_TUNE_PERCENT = 30
_SEP = re.compile(r"^(?:<\|endoftext\|>|<\|doc\|>|<<<[^\n]*>>>)[ \t]*$", re.MULTILINE)


def read_documents(path: str | Path) -> list[str]:
    """Non-empty documents of a .txt or .jsonl file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data: no such file {path}")
    if path.suffix == ".jsonl":
        docs = []
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"data: {path}:{n} is not valid JSON ({e.msg})") from None
                text = obj.get("text", obj.get("content")) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise ValueError(f"data: {path}:{n} has no string field 'text'")
                docs.append(text)
    elif path.suffix == ".txt":
        raw = path.read_text(encoding="utf-8", errors="replace")
        docs = _SEP.split(raw) if _SEP.search(raw) else list(_pieces(raw, 4000))
    else:
        raise ValueError(f"data: {path} must end in .txt or .jsonl")
    docs = [d.strip("\n") for d in docs if d.strip()]
    if not docs:
        raise ValueError(f"data: {path} holds no text")
    return docs


def _pieces(text: str, max_chars: int) -> Iterable[str]:
    paras, cur = re.split(r"\n\s*\n", text), ""
    for p in paras:
        if cur and len(cur) + len(p) > max_chars:
            yield cur
            cur = ""
        cur = f"{cur}\n\n{p}" if cur else p
    if cur:
        yield cur


def _hash_parts(text: str) -> tuple[int, int]:
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100, int.from_bytes(digest[8:16], "big") % 100


def is_eval_doc(text: str, eval_percent: int = DEFAULT_EVAL_PERCENT) -> bool:
    return _hash_parts(text)[0] < eval_percent


def doc_split(text: str, eval_percent: int = DEFAULT_EVAL_PERCENT,
              tune_percent: int = DEFAULT_TUNE_PERCENT) -> str:
    """"calib", "tune" or "report" (tune and report together are the eval half)."""
    first, second = _hash_parts(text)
    if first >= eval_percent:
        return "calib"
    return "tune" if second < tune_percent else "report"


def split_documents(docs: list[str], split: str, eval_percent: int = DEFAULT_EVAL_PERCENT,
                    tune_percent: int = DEFAULT_TUNE_PERCENT) -> list[str]:
    if split not in SPLITS:
        raise ValueError(f"split: must be one of {SPLITS}, got {split!r}")
    for name, v in (("eval_percent", eval_percent), ("tune_percent", tune_percent)):
        if not 0 <= v <= 100:
            raise ValueError(f"{name}: must be in [0, 100], got {v}")
    if split == "all":
        return list(docs)
    parts = {"eval": ("tune", "report")}.get(split, (split,))
    return [d for d in docs if doc_split(d, eval_percent, tune_percent) in parts]


def tokenize_documents(tokenizer, docs: list[str]) -> list[list[int]]:
    """Token ids per document (no special tokens added)."""
    return [list(tokenizer(d, add_special_tokens=False, verbose=False)["input_ids"]) for d in docs]


def windows(doc_ids: list[list[int]], length: int, limit: int | None = None,
            max_per_doc: int | None = None) -> list[tuple[int, list[int]]]:
    """Non-overlapping windows of `length` tokens, taken round-robin over documents.

    Returns (document index, token ids) pairs: first window of every document, then the second ...
    so a prefix of the list spreads over as many documents as possible.
    """
    per_doc = [[ids[i:i + length] for i in range(0, len(ids) - length + 1, length)] for ids in doc_ids]
    if max_per_doc is not None:
        per_doc = [w[:max_per_doc] for w in per_doc]
    out: list[tuple[int, list[int]]] = []
    for r in range(max((len(w) for w in per_doc), default=0)):
        for d, w in enumerate(per_doc):
            if r < len(w):
                out.append((d, w[r]))
                if limit is not None and len(out) >= limit:
                    return out
    return out


def distinct_batches(items: list[tuple[int, list[int]]], batch_size: int,
                     num_batches: int | None = None) -> list[list[tuple[int, list[int]]]]:
    """Greedy batches of `batch_size` windows from different documents, in list order."""
    queue, batches = list(items), []
    while queue and (num_batches is None or len(batches) < num_batches):
        batch, seen, rest = [], set(), []
        for item in queue:
            if len(batch) < batch_size and item[0] not in seen:
                batch.append(item)
                seen.add(item[0])
            else:
                rest.append(item)
        if len(batch) < batch_size:
            break
        batches.append(batch)
        queue = rest
    return batches
