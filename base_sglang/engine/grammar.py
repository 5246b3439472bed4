"""Constrained decoding (response_format json_object / json_schema) with xgrammar, on CPU or GPU.

One GrammarCompiler per engine (its tokenizer): it compiles a ResponseFormat once and keeps the
result in a bounded LRU cache keyed by (type, canonical schema text). Every sequence of a
constrained request owns a Grammar (an xgrammar matcher): before sampling, the sampler masks the
logits [B, V] of those rows with the matcher's token bitmask [B, ceil(V / 32)] int32, and after
sampling the engine advances the matcher with the sampled token. When the grammar has accepted its
end (EOS after a complete JSON value) the sequence finishes with "stop".

JSON is generated compact (no free whitespace: `any_whitespace=False`), so a weak model cannot
loop on spaces or newlines inside a value. xgrammar is imported on first use only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from ..protocol import ResponseFormat

JSON_OBJECT_SCHEMA = '{"type": "object"}'  # json_object = any JSON object (as SGLang maps it)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_ids, max_cached: int = 256,
                 max_threads: int = 1):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_ids = sorted(stop_ids)
        self.max_cached = max_cached
        self.max_threads = max_threads
        self.num_compiled = 0  # cache misses (compilations), for tests and stats
        self._cache: OrderedDict[tuple[str, str | None], object] = OrderedDict()
        self._lock = threading.Lock()
        self._compiler = None

    def compile(self, fmt: ResponseFormat):
        """The xgrammar CompiledGrammar of fmt (cached); ValueError "response_format: ...".

        Thread-safe: a server may call it off its event loop before submitting the request.
        """
        key = (fmt.type, fmt.schema)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        compiled = self._compile(fmt)
        with self._lock:
            self._cache[key] = compiled
            self.num_compiled += 1
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, fmt: ResponseFormat) -> Grammar:
        import xgrammar as xgr

        return Grammar(xgr.GrammarMatcher(self.compile(fmt)))

    def _compile(self, fmt: ResponseFormat):
        import xgrammar as xgr

        compiler = self._get_compiler()
        schema = JSON_OBJECT_SCHEMA if fmt.type == "json_object" else fmt.schema
        try:
            grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
            return compiler.compile_grammar(without_raw_controls(grammar))
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError / its own errors
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"response_format: the JSON schema is not supported: {msg}") from None

    def _get_compiler(self):
        with self._lock:
            if self._compiler is None:
                try:
                    import xgrammar as xgr
                except ImportError as exc:
                    raise ValueError("response_format: constrained decoding needs xgrammar "
                                     "(pip install 'base-sglang[grammar]')") from exc
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=self.max_threads,
                                                     cache_enabled=False)
            return self._compiler


# xgrammar (0.2.7 .. 0.2.9) writes the characters of a string with minLength / maxLength as
# [^"\\\r\n], which admits raw control characters (U+0000..U+001F) that JSON forbids inside a
# string: seen on the tiny test model, whose output {"name": "W\x02"} json.loads refuses. Its own
# unbounded strings exclude them ([^\0-\x1f"\\\r\n]); bounded ones get the same class here.
_LOOSE_CHARS = '[^\\"\\\\\\r\\n]'
_JSON_CHARS = '[^\\0-\\x1f\\"\\\\\\r\\n]'


def without_raw_controls(grammar):
    """The grammar with every loose string-character class replaced by JSON's (see above)."""
    import xgrammar as xgr

    text = str(grammar)
    return grammar if _LOOSE_CHARS not in text else xgr.Grammar.from_ebnf(
        text.replace(_LOOSE_CHARS, _JSON_CHARS))


class Grammar:
    """The matcher state of one sequence."""

    def __init__(self, matcher):
        self.matcher = matcher

    @property
    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it."""
        return bool(self.matcher.accept_token(token_id))


def apply_grammar_masks(logits: torch.Tensor, grammars: list[Grammar | None]) -> None:
    """Set logits [B, V] of tokens each row's grammar forbids to -inf, in place (rows without a
    grammar, or whose grammar has ended, are left alone)."""
    import xgrammar as xgr

    rows = [b for b, g in enumerate(grammars) if g is not None and not g.is_terminated]
    if not rows:
        return
    B, V = logits.shape
    bitmask = xgr.allocate_token_bitmask(B, V)  # [B, ceil(V / 32)] int32, all allowed
    for b in rows:
        grammars[b].matcher.fill_next_token_bitmask(bitmask, b)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), vocab_size=V, indices=rows)
