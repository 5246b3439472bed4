"""Prune and strip an unpacked wheel tree for the offline SGLang bundle (build_bundle.sh).

    python benchmarks/gpu/bundle_prune.py SITE --wheels DIR --info BUNDLE_INFO.json --python 3.12

Everything removed here is either never imported (tests, caches, type stubs, static archives,
C++ headers) or a binary for a feature that an H200 run with the Triton or
FlashInfer attention backend does not reach and that SGLang imports only when asked for it
(the reasons are next to each rule). What stays is the packages' own code, unmodified, except that
shared objects lose their debug symbols (`strip --strip-unneeded`, which keeps the dynamic symbol
table the loader and Python use). The dist-info folders stay whole: importlib.metadata reads
them (versions, entry points), and tvm_ffi finds xgrammar's library through its RECORD.
Prints a size table per distribution.
"""

from __future__ import annotations

import argparse
import csv
import json
import lzma
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

# (glob relative to the site dir, why it does not travel)
REMOVE = (
    ("sglang/multimodal_gen", "diffusion serving (sglang.multimodal_gen): not the LLM runtime"),
    ("sglang/test", "sglang's own test helpers"),
    ("sglang/srt/server/_core.*.so", "Rust HTTP server, only with SGLANG_RUST_SERVER=1"),
    ("sglang/srt/grpc/_core.*.so", "native gRPC server, only with --grpc-mode"),
    ("sglang/srt/multimodal/_core.*.so", "Rust image preprocessing of the Inkling VLM, opt-in"),
    ("sgl_kernel/flash_ops.abi3.so", "FA3 attention (1.1 GB): runs use --attention-backend triton"),
    ("sgl_kernel/flashmla_ops.abi3.so", "FlashMLA: DeepSeek MLA attention only"),
    ("sgl_kernel/infllm_ops.*.so", "InfLLM-v2 sparse attention (MiniCPM4) only"),
    ("sgl_kernel/sm100", "Blackwell (sm100) build of common_ops; Hopper loads sm90/"),
    ("xgrammar/lib", "static archive libxgrammar.a, for C++ consumers linking xgrammar"),
    ("xgrammar/include", "C++ headers, for C++ consumers"),
    ("**/__pycache__", "bytecode caches (Python rebuilds them)"),
    ("**/tests", "packages' test suites"),
    ("**/*.pyi", "type stubs, never imported"),
)


def _norm(name: str) -> str:
    return name.replace("-", "_").replace(".", "_").lower()


def merge_data_dirs(site: Path) -> list[str]:
    """Install `<dist>.data/{purelib,platlib}` like pip does; drop scripts/headers/data."""
    notes = []
    for data in sorted(site.glob("*.data")):
        for kind in ("purelib", "platlib"):
            lib = data / kind
            if lib.is_dir():
                shutil.copytree(lib, site, dirs_exist_ok=True)
        notes.append(f"{data.name}: {', '.join(sorted(p.name for p in data.iterdir()))}")
        shutil.rmtree(data)
    return notes


def file_owners(site: Path) -> dict[str, str]:
    """site-relative path -> distribution name, from the wheels' RECORD files."""
    owners = {}
    for record in site.glob("*.dist-info/RECORD"):
        dist = record.parent.name.split("-", 1)[0]
        with record.open(newline="") as fh:
            for row in csv.reader(fh):
                if row:
                    path = row[0].split(".data/purelib/", 1)[-1].split(".data/platlib/", 1)[-1]
                    owners[path] = dist
    return owners


def remove(site: Path) -> list[dict]:
    removed = []
    for pattern, why in REMOVE:
        for path in sorted(site.glob(pattern), key=lambda p: len(p.parts), reverse=True):
            if not path.exists():
                continue  # inside a folder removed just before
            size = _tree_size(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
            removed.append({"path": str(path.relative_to(site)), "bytes": size, "why": why})
    return removed


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _is_elf(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _has_symbols(path: Path) -> bool:
    sections = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True,
                              check=True).stdout
    return ".symtab" in sections or ".debug_" in sections


def strip_shared_objects(site: Path) -> list[dict]:
    """strip --strip-unneeded every ELF file that still carries a symbol table or debug info."""
    stripped = []
    for path in sorted(site.rglob("*")):
        if not path.is_file() or path.is_symlink() or not _is_elf(path) or not _has_symbols(path):
            continue
        before = path.stat().st_size
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
        stripped.append({"path": str(path.relative_to(site)), "before": before,
                         "after": path.stat().st_size})
    return stripped


def dist_versions(site: Path) -> dict[str, str]:
    """Name -> Version from every METADATA's header block (the description after it may quote
    lines that look like headers)."""
    out = {}
    for meta in site.glob("*.dist-info/METADATA"):
        fields = {}
        for line in meta.read_text(errors="replace").splitlines():
            if not line.strip():
                break
            key, sep, value = line.partition(": ")
            if sep and key in ("Name", "Version"):
                fields.setdefault(key, value.strip())
        out[fields["Name"]] = fields["Version"]
    return dict(sorted(out.items(), key=lambda kv: kv[0].lower()))


def sizes_by_dist(site: Path, owners: dict[str, str], xz: bool) -> dict[str, dict]:
    files = defaultdict(list)
    for path in site.rglob("*"):
        if path.is_file():
            rel = str(path.relative_to(site))
            files[owners.get(rel, rel.split("/", 1)[0])].append(path)
    out = {}
    for dist, paths in files.items():
        row = {"files": len(paths), "bytes": sum(p.stat().st_size for p in paths)}
        if xz:  # each distribution compressed alone (xz -6): what it adds to the bundle, roughly
            comp = lzma.LZMACompressor(preset=6)
            row["xz6_bytes"] = sum(len(comp.compress(p.read_bytes())) for p in sorted(paths))
            row["xz6_bytes"] += len(comp.flush())
        out[dist] = row
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", type=Path)
    ap.add_argument("--wheels", type=Path, required=True, help="the downloaded wheels (for sizes)")
    ap.add_argument("--info", type=Path, required=True, help="BUNDLE_INFO.json to write")
    ap.add_argument("--python", required=True, help="the CPython version the wheels are for")
    ap.add_argument("--no-xz-sizes", action="store_true", help="skip the per-package xz sizes")
    args = ap.parse_args(argv)
    site = args.site
    if not (site / "sglang").is_dir():
        print(f"{site}: no sglang package in it (unpack the wheels first)", file=sys.stderr)
        return 2

    data_notes = merge_data_dirs(site)
    owners = file_owners(site)
    before = sizes_by_dist(site, owners, xz=False)
    removed = remove(site)
    stripped = strip_shared_objects(site)
    after = sizes_by_dist(site, owners, xz=not args.no_xz_sizes)
    versions = dist_versions(site)
    wheel_bytes = {_norm(w.name.split("-")[0]): w.stat().st_size for w in args.wheels.glob("*.whl")}

    print(f"{'distribution':<28} {'wheel':>9} {'unpacked':>9} {'pruned':>9} {'xz -6':>8}  (MiB)")
    mib = lambda b: f"{b / 2**20:9.2f}"
    total = defaultdict(int)
    for dist in sorted(after, key=lambda d: -after[d].get("xz6_bytes", after[d]["bytes"])):
        w = wheel_bytes.get(_norm(dist), 0)
        b, a = before.get(dist, {"bytes": 0})["bytes"], after[dist]["bytes"]
        x = after[dist].get("xz6_bytes", 0)
        for k, v in (("wheel", w), ("unpacked", b), ("pruned", a), ("xz", x)):
            total[k] += v
        print(f"{dist:<28} {mib(w)} {mib(b)} {mib(a)} {x / 2**20:8.2f}")
    print(f"{'total':<28} {mib(total['wheel'])} {mib(total['unpacked'])} {mib(total['pruned'])} "
          f"{total['xz'] / 2**20:8.2f}")
    print(f"removed {len(removed)} paths ({sum(r['bytes'] for r in removed) / 2**20:.1f} MiB); "
          f"stripped {len(stripped)} shared objects "
          f"({sum(s['before'] - s['after'] for s in stripped) / 2**20:.1f} MiB of symbols)")
    for s in sorted(stripped, key=lambda s: s["after"] - s["before"])[:8]:
        print(f"  strip {s['path']}: {s['before'] / 2**20:.1f} -> {s['after'] / 2**20:.1f} MiB")

    info = {"sglang": versions.get("sglang"), "python": args.python,
            "platform": "manylinux x86_64", "distributions": versions,
            "removed": removed, "stripped": stripped, "data_dirs": data_notes,
            "sizes": after}
    args.info.write_text(json.dumps(info, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
