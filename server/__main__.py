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
from typing import NoReturn

from pydantic import ValidationError

from base_sglang.server.settings import Settings

FLAGS = {  # field -> help
    "model": "Hugging Face MoE checkpoint directory (default: the embedded proxy model)",
    "served_model_name": "model id clients send (default: the directory name)",
    "predictor": "predictor file (default: <model>/predictor.safetensors)",
    "policy": "expert selection policy in decode steps (base_plus; base = the paper's BASE, dense, "
              "gate_sum, ...)",
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
    "max_model_len": "tokens per request, prompt + output (default: the model's context length)",
    "max_request_bytes": "request bodies larger than this get HTTP 413",
    "shutdown_timeout": "seconds SIGTERM waits for in-flight requests before ending them",
    "log_level": "uvicorn log level",
}


def build_parser(defaults: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="base-serve", description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, help_text in FLAGS.items():
        default = getattr(defaults, name)
        kind = type(default) if isinstance(default, int) and not isinstance(default, bool) else None
        if name in ("max_budget", "num_threads", "max_model_len"):
            kind = int
        if name == "shutdown_timeout":
            kind = float
        shown = ("set" if default else "none") if name == "api_key" else default  # never echo a key
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, default=default,
                       type=kind or str, help=f"{help_text} [default: {shown}]")
    return p


def main(argv: list[str] | None = None) -> None:
    try:
        defaults = Settings()
    except ValidationError as exc:  # a bad BASE_* variable
        _fail(_validation_message(exc, env=True))
    parser = build_parser(defaults)
    args, extra = parser.parse_known_args(argv)
    if extra and args.backend == "native":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        settings = Settings(**vars(args), backend_args=extra)
    except ValidationError as exc:
        _fail(_validation_message(exc, env=False))
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        from base_sglang.server.app import create_app
        from base_sglang.server.backends import create_backend

        backend = create_backend(settings)
        app = create_app(backend, settings)
    except (FileNotFoundError, ValueError) as exc:
        _fail(_name_option(str(exc)))
    from base_sglang.server.shutdown import serve

    serve(app, settings.host, settings.port, settings.log_level, settings.shutdown_timeout)


def _fail(message: str) -> NoReturn:
    """One line on stderr and exit code 2, as argparse does for a bad flag."""
    print(f"base-serve: error: {message}", file=sys.stderr)
    sys.exit(2)


def _option(field: str) -> str:
    return f"--{field.replace('_', '-')} (BASE_{field.upper()})"


def _name_option(message: str) -> str:
    """"default_budget: ..." -> "--default-budget (BASE_DEFAULT_BUDGET): ..." for settings fields."""
    head, sep, rest = message.partition(":")
    if sep and head in Settings.model_fields:
        return f"{_option(head)}:{rest}"
    return message


def _validation_message(exc: ValidationError, env: bool) -> str:
    err = exc.errors()[0]
    field = str(err["loc"][0]) if err.get("loc") else "?"
    name = f"BASE_{field.upper()}" if env else _option(field)
    msg = err.get("msg", "invalid value").removeprefix("Value error, ").removeprefix(f"{field}: ")
    got = "" if "got " in msg else f" (got {err.get('input')!r})"
    return f"{name}: {msg}{got}"


if __name__ == "__main__":
    main()
