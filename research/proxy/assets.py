"""Where the shipped proxy model and held-out text live, and how to read the held-out text.

base_sglang/data/heldout.txt holds the corpus's held-out documents, in order, each introduced by a
line `<<<source>>>` (source key as in the model card, e.g. `pydoc`, `gosrc`, `austen`) followed by
the document's text. Documents never contain such a line.
"""

from __future__ import annotations

import os
import re

import base_sglang

PACKAGE_DIR = os.path.dirname(os.path.abspath(base_sglang.__file__))
MODEL_DIR = os.path.join(PACKAGE_DIR, "models", "proxy-moe")
HELDOUT_TXT = os.path.join(PACKAGE_DIR, "data", "heldout.txt")

_HEADER = re.compile(r"^<<<([A-Za-z0-9_.:+-]+)>>>\n", re.M)


def format_heldout(docs: list[tuple[str, str]]) -> str:
    """[(source, text)] -> the heldout.txt format."""
    out = []
    for source, text in docs:
        if _HEADER.search(text):
            raise ValueError(f"document from {source} contains a <<<source>>> header line")
        out.append(f"<<<{source}>>>\n{text if text.endswith(chr(10)) else text + chr(10)}")
    return "".join(out)


def read_heldout(path: str = HELDOUT_TXT, sources: set[str] | None = None) -> list[tuple[str, str]]:
    """[(source, text)] in file order; `sources` keeps only those source keys."""
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    heads = list(_HEADER.finditer(raw))
    if not heads or heads[0].start() != 0:
        raise ValueError(f"{path}: not a held-out text file (must start with a <<<source>>> line)")
    docs = []
    for h, nxt in zip(heads, heads[1:] + [None]):
        text = raw[h.end() : nxt.start() if nxt else len(raw)]
        if sources is None or h.group(1) in sources:
            docs.append((h.group(1), text))
    return docs
