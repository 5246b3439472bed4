"""Unpack the files of SGLang 0.5.23 that benchmarks/sglang_triton_moe.py loads (its Triton MoE kernels,
align kernels and tuned configs, ~2.5 MB) from the wheel, for the device run to carry.

    python benchmarks/fetch_sglang_moe.py                    # pip download the wheel into .whl/, unpack
                                                             # to .device_carry/sglang-0.5.23/
    python benchmarks/fetch_sglang_moe.py --wheel DIR --dest DIR   # unpack an existing wheel only
Nothing of SGLang is committed: .whl/ and .device_carry/ are git-ignored.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import zipfile

VERSION = "0.5.23"
PREFIXES = ("sglang/kernels/ops/moe/", "sglang/srt/layers/moe/moe_runner/triton_utils/")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", default=".whl", help="folder with (or for) the sglang wheel")
    ap.add_argument("--dest", default=f".device_carry/sglang-{VERSION}")
    args = ap.parse_args()
    found = glob.glob(os.path.join(args.wheel, f"sglang-{VERSION}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        f"sglang=={VERSION}", "-d", args.wheel], check=True)
        found = glob.glob(os.path.join(args.wheel, f"sglang-{VERSION}-*.whl"))
    if not found:
        print(f"--wheel: no sglang-{VERSION}-*.whl in {args.wheel}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(found[0]) as z:
        names = [n for n in z.namelist() if n.startswith(PREFIXES)]
        z.extractall(args.dest, names)
    size = sum(os.path.getsize(os.path.join(args.dest, n)) for n in names)
    print(f"{len(names)} files ({size / 1e6:.1f} MB) of {os.path.basename(found[0])} -> {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
