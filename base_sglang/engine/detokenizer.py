"""Incremental text for one request: stop strings, held-back partial characters, text deltas."""

from __future__ import annotations


class Detokenizer:
    """Turns a growing list of output token ids into text deltas.

    The full output is decoded at every step (cheap for the lengths served here) so byte-level BPE
    merges across tokens are always right. Text that might still change is held back: a trailing
    U+FFFD (an incomplete UTF-8 sequence) and any suffix that could be the start of a stop string.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.text = ""  # text emitted so far
        self.stopped = False

    def update(self, token_ids: list[int], final: bool = False, check_stop: bool = True) -> str:
        """Decode token_ids (the whole output); return the new text. Sets `stopped` on a stop
        string (not searched while check_stop is False: before min_tokens, as vLLM)."""
        full = self.tokenizer.decode(token_ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)
        cut = self._find_stop(full) if check_stop else None
        if cut is not None:
            self.stopped = True
            full, final = full[:cut], True
        end = len(full) if final else self._safe_end(full)
        delta = full[len(self.text):end] if end > len(self.text) else ""
        self.text += delta
        return delta

    def _find_stop(self, full: str) -> int | None:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        hits = [i for i in (full.find(s, start) for s in self.stop) if i >= 0]
        return min(hits) if hits else None

    def _safe_end(self, full: str) -> int:
        end = len(full)
        while end > len(self.text) and full[end - 1] == "\ufffd":
            end -= 1
        hold = 0  # longest tail that a stop string could still complete
        for s in self.stop:
            for n in range(min(len(s) - 1, end), hold, -1):
                if full[end - n:end] == s[:n]:
                    hold = n
                    break
        return max(end - hold, len(self.text))
