#!/usr/bin/env bash
# Install the offline SGLang bundle (build_bundle.sh) on a GPU node without network, and check it.
#
#   benchmarks/gpu/install_bundle.sh BUNDLE.tar.xz [DEST]        (DEST default /tmp/sgl-bundle)
#   source DEST/env.sh && python3 -m sglang.launch_server ...     (then plain python3 works)
#
# 1. unpacks BUNDLE into DEST/site (skipped when DEST already holds this very bundle);
# 2. registers this checkout without pip (bundle_register.py): DEST/project/sitecustomize.py maps
#    base_sglang.{kernels,server,calibration} to the repo's folders (from any working directory),
#    DEST/site/base_sglang-*.dist-info/entry_points.txt makes SGLang's load_plugins() find
#    `base = base_sglang.plugin:register`, DEST/bin has base-serve;
# 3. writes DEST/env.sh: PYTHONPATH=DEST/site:DEST/project ahead of the interpreter's
#    site-packages (so the bundle's transformers 5.12.1 wins over the node's), DEST/bin on PATH,
#    FlashInfer's JIT cache under DEST/cache, HF hub offline;
# 4. runs bundle_check.py under env.sh: versions, xgrammar compiles a grammar, the import chain
#    of the engine / launch_server / bench_one_batch / bench_serving / model runner / TopK /
#    Qwen3-MoE, the plugin's entry point and load_plugins(), and that every shared object of the
#    bundle loads (stripped ones included). Any failure stops here, naming the missing module.
# Options (environment): PYTHON (default python3), BUNDLE_CHECK=cpu (a CPU-only machine: skip
# the CUDA-only modules) or BUNDLE_CHECK=off.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bundle=${1:?usage: install_bundle.sh BUNDLE.tar.xz [DEST]}
dest=${2:-/tmp/sgl-bundle}
python=${PYTHON:-python3}
check=${BUNDLE_CHECK:-on}
[ -f "$bundle" ] || { echo "install_bundle.sh: no bundle at $bundle (build it with" \
    "benchmarks/gpu/build_bundle.sh on a connected machine and carry .device_carry/)" >&2; exit 2; }
case "$check" in on|cpu|off) ;; *) echo "install_bundle.sh: BUNDLE_CHECK must be on, cpu or off" >&2; exit 2 ;; esac
command -v "$python" >/dev/null || { echo "install_bundle.sh: no $python" >&2; exit 2; }
mkdir -p "$dest"
rm -f "$dest/env.sh"  # written again below, only once the bundle is in place
dest=$(cd "$dest" && pwd)

stamp="$(basename "$bundle") $(stat -c %s "$bundle")"
if [ -f "$dest/.installed" ] && [ "$(cat "$dest/.installed")" = "$stamp" ] && [ -d "$dest/site" ]; then
    echo "== $dest already holds $stamp"
else
    echo "== unpack $bundle -> $dest"
    rm -rf "$dest/site" "$dest/BUNDLE_INFO.json" "$dest/.installed"
    start=$SECONDS
    if command -v xz >/dev/null; then
        xz -dc -T0 "$bundle" | tar -C "$dest" -xf -
    else  # Python's lzma: slower, same result
        "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
            "$bundle" "$dest"
    fi
    [ -d "$dest/site/sglang" ] || { echo "install_bundle.sh: $bundle holds no site/sglang" >&2; exit 1; }
    echo "$stamp" > "$dest/.installed"
    echo "   unpacked in $((SECONDS - start)) s: $(du -sh "$dest/site" | cut -f1)"
fi

pyver=$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
bundle_py=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["python"])' \
    "$dest/BUNDLE_INFO.json")
if [ "$pyver" != "$bundle_py" ]; then
    echo "install_bundle.sh: the bundle is for CPython $bundle_py, $python is $pyver" \
        "(build one with build_bundle.sh --python $pyver)" >&2
    exit 1
fi

echo "== register $repo"
"$python" "$here/bundle_register.py" "$repo" "$dest"

mkdir -p "$dest/cache"
cat > "$dest/env.sh" <<EOF
# written by benchmarks/gpu/install_bundle.sh: source it, then plain python3 runs sglang + BASE
export BASE_SGLANG_BUNDLE="$dest"
export PYTHONPATH="$dest/site:$dest/project\${PYTHONPATH:+:\$PYTHONPATH}"
export PATH="$dest/bin:\$PATH"
export FLASHINFER_WORKSPACE_BASE="$dest/cache"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
EOF
echo "== wrote $dest/env.sh"

if [ "$check" = off ]; then
    exit 0
fi
echo "== check"
# shellcheck disable=SC1091
source "$dest/env.sh"
cpu=(); [ "$check" = cpu ] && cpu=(--cpu)
# shared objects in a process of their own (torch_memory_saver's preload hooks interpose CUDA's
# allocator in whatever process loads them)
if ! "$python" "$here/bundle_check.py" --so "$dest/site" --only-so \
        || ! "$python" "$here/bundle_check.py" "${cpu[@]}" --plugin "$repo" \
            --tokenizer "$here/qwen3-30b-a3b" \
        || ! (cd "$repo" && "$python" -c 'import base_sglang.kernels, base_sglang.server, base_sglang.calibration
print("base_sglang imports from the checkout itself too (python -m there)")'); then
    echo "install_bundle.sh: the bundle in $dest does not work here (see above)" >&2
    exit 1
fi
