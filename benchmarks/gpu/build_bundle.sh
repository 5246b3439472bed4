#!/usr/bin/env bash
# Build the offline SGLang bundle for a GPU node without network (the H200 device, or any
# air-gapped node that has Python + torch + triton): ONE tar.xz of pruned, unpacked wheels.
#
#   benchmarks/gpu/build_bundle.sh [--python 3.12] [--out .device_carry] [--requirements FILE]
#
# On a connected machine it downloads the exact wheels of bundle-requirements.txt for CPython
# X.Y x86-64 manylinux (--no-deps: the list is the closure), unpacks them into one site dir,
# prunes what a GPU run does not import (bundle_prune.py: sglang/multimodal_gen and tests,
# sglang-kernel's FA3/FlashMLA/sm100/infllm binaries, xgrammar's static archive, caches, stubs),
# strips debug symbols from shared objects, and packs
#     OUT/sglang-<version>-cpXY.tar.xz      (site/ + BUNDLE_INFO.json)
# Install it on the node with benchmarks/gpu/install_bundle.sh. --python 3.11 builds the same
# bundle for CPython 3.11: this machine checks its import chain on CPU (bundle_check.py).
# Wheels are cached under $BASE_BUNDLE_CACHE (default ~/.cache/base-sglang/bundle).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=3.12
out="$repo/.device_carry"
reqs="$here/bundle-requirements.txt"
while [ $# -gt 0 ]; do
    case "$1" in
        --python) py=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --requirements) reqs=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "build_bundle.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$py" =~ ^3\.[0-9]+$ ]] || { echo "build_bundle.sh: --python must look like 3.12, got $py" >&2; exit 2; }
for tool in pip xz tar unzip strip readelf; do
    command -v "$tool" >/dev/null || { echo "build_bundle.sh: $tool is needed" >&2; exit 2; }
done
tag="cp${py/./}"
cache="${BASE_BUNDLE_CACHE:-$HOME/.cache/base-sglang/bundle}"
wheels="$cache/wheels-$tag"
stage="$cache/stage-$tag"
mkdir -p "$wheels" "$out"

echo "== download ($tag, manylinux x86-64) -> $wheels"
platforms=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 manylinux_2_17 \
         manylinux2014 manylinux_2_12 manylinux2010 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${p}_x86_64")
done
pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$py" --implementation cp "${platforms[@]}" -d "$wheels" -r "$reqs"

# exactly one wheel per requirement, nothing stale from an earlier pin
python3 - "$reqs" "$wheels" <<'EOF'
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
pins = {}
for line in Path(sys.argv[1]).read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, version = line.partition("==")
        if not version:
            sys.exit(f"{sys.argv[1]}: {line!r} is not an exact pin (name==version)")
        pins[norm(name)] = version.strip()
have = {}
for whl in Path(sys.argv[2]).glob("*.whl"):
    name, version = whl.name.split("-")[:2]
    if pins.get(norm(name)) == version:
        have.setdefault(norm(name), []).append(whl.name)
    else:
        whl.unlink()  # an earlier pin of this cache
missing = sorted(set(pins) - set(have))
if missing:
    sys.exit(f"no wheel downloaded for: {', '.join(missing)}")
dup = {k: v for k, v in have.items() if len(v) > 1}
if dup:
    sys.exit(f"several wheels for one pin: {dup}")
EOF

echo "== unpack -> $stage/site"
rm -rf "$stage"
mkdir -p "$stage/site"
for whl in "$wheels"/*.whl; do
    unzip -q -o "$whl" -d "$stage/site"
done

echo "== prune + strip"
python3 "$here/bundle_prune.py" "$stage/site" --wheels "$wheels" --info "$stage/BUNDLE_INFO.json" \
    --python "$py"

version=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['sglang'])" "$stage/BUNDLE_INFO.json")
name="sglang-$version-$tag"
tarball="$out/$name.tar.xz"
echo "== pack -> $tarball"
# fixed order and owner: the same wheels give the same archive contents
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00Z' \
    -cf - site BUNDLE_INFO.json | xz -9e -T2 > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"

# what one device call would carry: the repo's tracked files (minus the proxy weights, which
# ../shared/tools/device-slim keeps home) plus this bundle; the limit is 64 MiB
tracked=$(cd "$repo" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
weights=$(cd "$repo" && git ls-files -z base_sglang/models/proxy-moe | xargs -0 du -cb 2>/dev/null \
    | tail -1 | cut -f1)
bundle=$(stat -c %s "$tarball")
python3 - "$tarball" "$bundle" "$tracked" "$weights" <<'EOF'
import sys
path, bundle, tracked, weights = sys.argv[1], *map(int, sys.argv[2:])
mib = lambda b: f"{b / 2**20:8.2f} MiB"
limit = 64 * 2**20
rows = [("bundle " + path.rsplit("/", 1)[-1], bundle),
        ("repo tracked files", tracked),
        ("  of which proxy weights (keep home: device-slim)", weights),
        ("call = bundle + repo - proxy weights", bundle + tracked - weights),
        ("call with the proxy weights", bundle + tracked)]
print(f"\n{'what':<52} {'size':>12}")
for what, size in rows:
    print(f"{what:<52} {mib(size)}")
total = bundle + tracked - weights
print(f"{'device-call limit':<52} {mib(limit)}  ->  {'fits' if total < limit else 'DOES NOT FIT'}"
      f" ({mib(limit - total).strip()} to spare)")
EOF
