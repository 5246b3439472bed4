"""Graceful shutdown with a deadline, for base-serve's uvicorn server.

The first SIGTERM/SIGINT stops accepting connections (health probes and load balancers see it at
once) and lets the requests in flight finish. After --shutdown-timeout seconds the
backend ends whatever is left with an error (a stream gets an SSE error event and [DONE], a waiting
non-streaming client a 503 with Retry-After), the app shuts the backend down and the process exits
0. A second signal exits at once (status 128 + signal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

import uvicorn

from base_sglang.protocol import SHUTTING_DOWN

log = logging.getLogger("base_sglang.server")
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app, shutdown_timeout: float):
        super().__init__(config)
        self.app_ref = app
        self.shutdown_timeout = shutdown_timeout
        self._deadline: threading.Timer | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        """Our own handlers (uvicorn's re-raise the signal after serving, which would end the
        process with 128 + signal instead of 0); restored afterwards."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        if self.should_exit:  # the second signal: no more waiting
            log.warning("base-serve: second signal %s, exiting now", signal.Signals(sig).name)
            os._exit(128 + sig)
        log.info("base-serve: %s: draining in-flight requests for up to %g s",
                 signal.Signals(sig).name, self.shutdown_timeout)
        self.should_exit = True
        self._deadline = threading.Timer(self.shutdown_timeout, self._expire)
        self._deadline.daemon = True
        self._deadline.start()

    def _expire(self) -> None:
        """The drain deadline: end every request still live (from the server's event loop)."""
        loop = self.app_ref.state.loop
        backend = self.app_ref.state.backend
        if loop is None or loop.is_closed():
            return

        def end_all():
            n = backend.abort_all(SHUTTING_DOWN)
            log.warning("base-serve: shutdown deadline reached, ended %d request(s)", n)

        loop.call_soon_threadsafe(end_all)


def serve(app, host: str, port: int, log_level: str, shutdown_timeout: float) -> None:
    """Run the app until a signal; return once drained (exit status 0)."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=shutdown_timeout + 10)
    GracefulServer(config, app, shutdown_timeout).run()
