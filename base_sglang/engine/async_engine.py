"""Async front of LLMEngine for the server: the step loop runs in one background thread.

Requests and aborts are handed to the loop through a queue and applied between steps; each request's
outputs come back through its own asyncio.Queue. `_streams` (live requests) is changed only on the
event-loop side; the engine thread only reads it. Leaving the `generate` iterator early (client gone,
task cancelled) aborts the request, which frees its batch slot at the next step boundary.
A step that raises fails the requests of that batch (LLMEngine.step turns it into error outputs),
and a request whose logits are not finite fails alone; the loop carries on either way.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import traceback
from collections.abc import AsyncIterator

from ..protocol import QueueFull, RequestOutput
from .llm_engine import LLMEngine

log = logging.getLogger(__name__)


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def capacity(self) -> int:
        sched = self.engine.scheduler
        return sched.max_running + sched.max_waiting

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="base-engine", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    @property
    def num_live(self) -> int:
        return len(self._streams)

    def generate(self, prompt_ids: list[int], params, budget: int | str | dict | None,
                 request_id: str, max_error: float | None = None) -> AsyncIterator[RequestOutput]:
        """Submit now and return the request's output stream (ends with the finished output).

        budget, max_error: as LLMEngine.add_request. Raises ValueError (naming the field) or
        QueueFull right away. Leaving the stream early aborts the request; a stream that is never
        iterated must be given to abort().
        """
        budget, max_error = self.engine.resolve_request_budget(budget, max_error)
        self.engine.validate(prompt_ids, params)
        if self.num_live >= self.capacity:
            raise QueueFull(f"the server is at capacity ({self.capacity} requests)")
        if request_id in self._streams:
            raise ValueError(f"request_id: {request_id!r} is already running")
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = (asyncio.get_running_loop(), q)
        self._send(("add", request_id, prompt_ids, params, budget, max_error))
        return self._stream(request_id, q, params.n)

    async def _stream(self, request_id: str, q: asyncio.Queue,
                      num_choices: int) -> AsyncIterator[RequestOutput]:
        """Outputs of every choice, interleaved, until each of the num_choices has finished."""
        left = set(range(num_choices))
        finished = False
        try:
            while not finished:
                out = await q.get()
                if isinstance(out, BaseException):
                    finished = True  # the engine never admitted it
                    raise out
                if out.finished:
                    left.discard(out.index)
                finished = not left
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._send(("abort", request_id))

    def abort(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._send(("abort", request_id))

    def abort_all(self, error: str) -> int:
        """End every live request now with an error output (shutdown deadline); -> how many."""
        live = list(self._streams)
        for rid in live:
            loop, q = self._streams[rid]
            final = RequestOutput(request_id=rid, token_ids=[], text="", logprobs=None,
                                  prompt_logprobs=None, finished=True, finish_reason="error",
                                  num_prompt_tokens=0, num_output_tokens=0, budget=0,
                                  experts_per_layer=None, experts_per_layer_routed=None,
                                  error=error)
            try:
                loop.call_soon_threadsafe(q.put_nowait, final)
            except RuntimeError:  # the event loop is closed
                pass
            self._send(("abort", rid))
        return len(live)

    # ---- engine thread -----------------------------------------------------------------------
    def _send(self, command) -> None:
        self._commands.put(command)
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._apply_commands()
            if not self.engine.has_unfinished():
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # one bad batch must not stop the server
                log.error("engine step failed: %s", traceback.format_exc())
                outputs = self.engine.fail_step(f"{type(exc).__name__}: {exc}")
            for out in outputs:
                self._deliver(out.request_id, out)

    def _apply_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, prompt_ids, params, budget, max_error = cmd
                try:
                    self.engine.add_request(prompt_ids, params, budget, request_id=rid,
                                            max_error=max_error)
                except (ValueError, QueueFull) as exc:
                    self._deliver(rid, exc)
            else:
                try:
                    self.engine.abort(cmd[1])
                except Exception:  # never let a bad abort stop the loop
                    log.error("abort of %s failed: %s", cmd[1], traceback.format_exc())

    def _deliver(self, request_id: str, item) -> None:
        target = self._streams.get(request_id)
        if target is None:
            return
        loop, q = target
        try:
            loop.call_soon_threadsafe(q.put_nowait, item)
        except RuntimeError:  # the event loop is closed
            pass
