"""Continuous batching: a bounded waiting queue and the running batch, changed between steps."""

from __future__ import annotations

import time
from collections import deque

from ..protocol import QueueFull
from .sequence import Sequence, SequenceStatus


class Scheduler:
    """Prefill first: a step either admits waiting requests (dense prefill) or decodes all running.

    `running` is kept in the order of the rows of the batched KV cache: admitted requests are
    appended, retired ones removed in place.
    """

    def __init__(self, max_running: int, max_waiting: int, max_prefill_tokens: int):
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        free_slots = max(0, self.max_running - len(self.running))
        if len(self.waiting) >= self.max_waiting + free_slots:
            raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests)")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Return (sequences, is_prefill)."""
        admitted: list[Sequence] = []
        longest = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            seq = self.waiting[0]
            longest = max(longest, len(seq.prompt_ids))
            if admitted and longest * (len(admitted) + 1) > self.max_prefill_tokens:
                break
            admitted.append(self.waiting.popleft())
        if admitted:
            now = time.monotonic()
            for seq in admitted:
                seq.status = SequenceStatus.RUNNING
                seq.scheduled_time = now
            self.running.extend(admitted)
            return admitted, True
        return list(self.running), False

    def retire(self, seqs: list[Sequence]) -> None:
        gone = {id(s) for s in seqs}
        self.running = [s for s in self.running if id(s) not in gone]

    def remove_waiting(self, request_id: str) -> Sequence | None:
        for seq in self.waiting:
            if seq.request_id == request_id:
                self.waiting.remove(seq)
                return seq
        return None

    def find_running(self, request_id: str) -> Sequence | None:
        return next((s for s in self.running if s.request_id == request_id), None)
