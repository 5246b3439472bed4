"""base-serve: serve a MoE model with per-request expert budgets behind an OpenAI-compatible API.

    base-serve                                   # the embedded proxy model on 127.0.0.1:8000
    base-serve --model DIR --default-budget 8 --api-key KEY
Every flag can also be set as a BASE_* environment variable (e.g. BASE_DEFAULT_BUDGET=8).
Arguments base-serve does not know go to the backend (`--backend sglang`: SGLang server arguments
such as --tp-size); the native backend refuses them.
"""

from __future__ import annotations

import argparse
import logging
import sys

from base_sglang.server.settings import Settings

FLAGS = {  # field -> help
    "model": "Hugging Face MoE checkpoint directory (default: the embedded proxy model)",
    "served_model_name": "model id clients send (default: the directory name)",
    "predictor": "predictor file (default: <model>/predictor.safetensors)",
    "policy": "expert selection policy in decode steps (base, dense, gate_sum, ...)",
    "default_budget": "budget of requests that set none: experts per MoE layer per step, or dense",
    "min_budget": "smallest budget a request may ask for",
    "max_budget": "largest budget a request may ask for (default: E, i.e. dense allowed)",
    "host": "bind address",
    "port": "TCP port",
    "max_running_requests": "requests decoded together in one batch",
    "max_waiting_requests": "bounded waiting queue; beyond it requests get HTTP 503",
    "backend": "serving backend (native; sglang with the plugin)",
    "api_key": "require 'Authorization: Bearer KEY' on /v1 routes",
    "device": "auto, cpu or cuda[:N] (native backend)",
    "dtype": "auto, float32, bfloat16 or float16 (native backend)",
    "num_threads": "torch CPU threads (native backend; default: torch's choice)",
    "log_level": "uvicorn log level",
}


def build_parser(defaults: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="base-serve", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, help_text in FLAGS.items():
        default = getattr(defaults, name)
        kind = type(default) if isinstance(default, int) and not isinstance(default, bool) else None
        if name in ("max_budget", "num_threads"):
            kind = int
        shown = ("set" if default else "none") if name == "api_key" else default  # never echo a key
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=default,
                       type=kind or str, help=f"{help_text} [default: {shown}]")
    return p


def main(argv: list[str] | None = None) -> None:
    try:
        defaults = Settings()
    except Exception as exc:  # a bad BASE_* variable
        sys.exit(f"base-serve: error: {exc}")
    parser = build_parser(defaults)
    args, extra = parser.parse_known_args(argv)
    if extra and args.backend == "native":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    settings = Settings(**vars(args), backend_args=extra)
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        from base_sglang.server.app import create_app
        from base_sglang.server.backends import create_backend

        backend = create_backend(settings)
        app = create_app(backend, settings)
    except (FileNotFoundError, ValueError) as exc:
        sys.exit(f"base-serve: error: {exc}")
    import uvicorn

    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level)


if __name__ == "__main__":
    main()
