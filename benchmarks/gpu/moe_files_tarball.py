"""Write .whl/sglang-0.5.23-moe.tar.gz: the SGLang Triton MoE files the kernel benchmarks load
(sglang_triton_moe.py), taken from the sglang 0.5.23 wheel in .whl/. It is 0.2 MB against the
wheel's 39 MB, so it can travel with the 38 MB SGLang bundle (gpu_env.sh unpack_sglang_wheel).

    python benchmarks/gpu/moe_files_tarball.py
"""

from __future__ import annotations

import glob
import io
import sys
import tarfile
import zipfile

PREFIXES = ("sglang/kernels/ops/moe/", "sglang/srt/layers/moe/moe_runner/triton_utils/")


def main() -> int:
    wheels = glob.glob(".whl/sglang-0.5.23-*.whl")
    if not wheels:
        print("moe_files_tarball: no .whl/sglang-0.5.23-*.whl (pip download sglang==0.5.23 "
              "--no-deps -d .whl)", file=sys.stderr)
        return 2
    z = zipfile.ZipFile(wheels[0])
    names = [n for n in z.namelist() if n.startswith(PREFIXES) and not n.endswith("/")]
    with tarfile.open(".whl/sglang-0.5.23-moe.tar.gz", "w:gz") as t:
        for n in names:
            data = z.read(n)
            info = tarfile.TarInfo(n)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    print(f"wrote .whl/sglang-0.5.23-moe.tar.gz: {len(names)} files from {wheels[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
