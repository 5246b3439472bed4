"""Per-request sampling settings (validated once; the server maps its pydantic body onto this)."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LOGPROBS = 20
SAMPLING_EPS = 1e-5  # temperatures below this are greedy (dividing logits by them overflows)


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below SAMPLING_EPS) is greedy; top_k <= 0 and top_p = 1 switch those
    filters off.

    logprobs        : None, or the number of top alternatives returned with each generated token.
    prompt_logprobs : None, or the same for the prompt tokens (completions `echo` + `logprobs`).
    stop            : strings that end the output (not included in it).
    seed            : per-request generator; None uses the engine's global one.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    ignore_eos: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        if not self.temperature >= 0.0:  # also rejects NaN
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens: must be >= 0, got {self.max_tokens}")
        if any((not isinstance(s, str)) or s == "" for s in self.stop):
            raise ValueError("stop: every stop sequence must be a non-empty string")
        for name in ("logprobs", "prompt_logprobs"):
            n = getattr(self, name)
            if n is not None and not 0 <= n <= MAX_LOGPROBS:
                raise ValueError(f"{name}: must be in [0, {MAX_LOGPROBS}], got {n}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS or self.top_k == 1
