"""Continuous batching: a bounded waiting queue and the running batch, changed between steps."""

from __future__ import annotations

import time
from collections import deque

from ..protocol import QueueFull
from .sequence import Sequence, SequenceStatus


class Scheduler:
    """Prefill first: a step either admits waiting requests (dense prefill) or decodes all running.

    The waiting queue holds requests: the group of a request's choices (n or best_of sequences),
    admitted together, whose prompt is prefilled once. `running` holds sequences in the order of
    the rows of the batched KV cache: admitted groups are appended, retired rows removed in place.
    """

    def __init__(self, max_running: int, max_waiting: int, max_prefill_tokens: int):
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.max_prefill_tokens = max_prefill_tokens
        self.waiting: deque[list[Sequence]] = deque()
        self.running: list[Sequence] = []

    def add(self, group: list[Sequence]) -> None:
        free_slots = max(0, self.max_running - len(self.running))
        if len(self.waiting) >= self.max_waiting + free_slots:
            raise QueueFull(f"the waiting queue is full ({self.max_waiting} requests)")
        self.waiting.append(group)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Return (sequences, is_prefill); a prefill's sequences come group by group."""
        admitted: list[Sequence] = []
        longest, prompts = 0, 0
        while self.waiting and len(self.running) + len(admitted) + len(self.waiting[0]) \
                <= self.max_running:
            group = self.waiting[0]
            longest = max(longest, len(group[0].prompt_ids))
            if admitted and longest * (prompts + 1) > self.max_prefill_tokens:
                break
            admitted += self.waiting.popleft()
            prompts += 1
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

    def remove_waiting(self, request_id: str) -> list[Sequence] | None:
        for group in self.waiting:
            if group[0].request_id == request_id:
                self.waiting.remove(group)
                return group
        return None

    def find_running(self, request_id: str) -> list[Sequence]:
        return [s for s in self.running if s.request_id == request_id]
