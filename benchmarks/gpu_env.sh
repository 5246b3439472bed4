# Helpers of the device scripts (sourced, not run). Needs: cd to the repository root first.
#   map_package           base_sglang.kernels/.server/.calibration importable without an install:
#                         a package of symlinks (kernels/, server/, calibration/ mapped into it) on
#                         PYTHONPATH; exports PKG (its folder, empty when already installed)
#   unpack_sglang_wheel   SGLang 0.5.23's Triton MoE files from .whl/ to /tmp/sglang_whl (from
#                         .whl/sglang-0.5.23-moe.tar.gz when present: those files alone, built from
#                         the wheel by benchmarks/gpu/moe_files_tarball.py)
#   kernel_run_env DIR    the kernel scripts' setup: OUT (default DIR) created, PYTHONUNBUFFERED and
#                         BASE_COMMIT exported (pass BASE_COMMIT: the device's git is stale),
#                         ROOT = the repository root, then map_package

map_package() {
    PKG=""
    if ! python3 -c "import base_sglang.kernels, base_sglang.server" 2>/dev/null; then
        PKG=$(mktemp -d)/pkg
        mkdir -p "$PKG/base_sglang"
        local f d
        for f in "$PWD"/base_sglang/*; do ln -s "$f" "$PKG/base_sglang/"; done
        for d in kernels server calibration; do ln -s "$PWD/$d" "$PKG/base_sglang/$d"; done
        export PYTHONPATH=$PKG
    fi
    export PKG
}

unpack_sglang_wheel() {
    python3 - <<'PY'
import glob, tarfile, zipfile
small = glob.glob(".whl/sglang-0.5.23-moe.tar.gz")  # those files alone (0.2 MB: carry it with a bundle)
if small:
    with tarfile.open(small[0]) as t:
        t.extractall("/tmp/sglang_whl")
        print(len(t.getnames()), "files unpacked from", small[0])
else:
    z = zipfile.ZipFile(glob.glob(".whl/sglang-0.5.23-*.whl")[0])
    names = [n for n in z.namelist() if n.startswith(("sglang/kernels/ops/moe/",
                                                      "sglang/srt/layers/moe/moe_runner/triton_utils/"))]
    z.extractall("/tmp/sglang_whl", names)
    print(len(names), "files unpacked from the sglang wheel")
PY
}

kernel_run_env() {
    OUT=${OUT:-$1}
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    export BASE_COMMIT=${BASE_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    ROOT=$PWD
    map_package  # not installed: a package of links
}
