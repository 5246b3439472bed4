"""Serving backends, by name. Each implements base_sglang.protocol.Backend (the whole contract the
HTTP layer relies on) and neither imports the other.

A backend module has `create_backend(settings)` (settings: server.settings.Settings; CLI arguments
base-serve does not know arrive in `settings.backend_args` for the backend to parse, e.g. SGLang's
--tp-size) returning a Backend; it raises FileNotFoundError or ValueError with a message naming the
option for bad settings (base-serve prints it in one line and exits 2).
"""

from __future__ import annotations

from importlib import import_module

from base_sglang.protocol import Backend

BACKENDS = {
    "native": "base_sglang.server.backends.native",
    "sglang": "base_sglang.server.backends.sglang",
}


def create_backend(settings) -> Backend:
    """Build the backend named by settings.backend (imported lazily)."""
    if settings.backend not in BACKENDS:
        raise ValueError(f"backend: unknown {settings.backend!r}; choose one of {sorted(BACKENDS)}")
    try:
        module = import_module(BACKENDS[settings.backend])
    except ModuleNotFoundError as exc:
        raise ValueError(f"backend: {settings.backend!r} is not available here ({exc})") from exc
    return module.create_backend(settings)
