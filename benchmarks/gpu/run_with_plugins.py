"""Run an SGLang module as `python -m MODULE` would, after `sglang.srt.plugins.load_plugins()`.

    python3 benchmarks/gpu/run_with_plugins.py sglang.bench_one_batch --model-path ... [args]

Entry points such as `sglang.bench_one_batch` build the ModelRunner in this process without
loading plugins (launch_server and the scheduler processes do load them); this loads them first,
so BASE's hooks (and any other installed plugin's) are applied before the model is built.
"""

from __future__ import annotations

import runpy
import sys


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        sys.exit("usage: run_with_plugins.py MODULE [ARGS...]   (e.g. sglang.bench_one_batch)")
    module = sys.argv[1]
    from sglang.srt.plugins import load_plugins

    load_plugins()
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
