"""Logits processing and sampling for a batch of rows, and token logprobs.

Order (as vLLM's sampler): grammar mask -> logit_bias -> min_tokens (EOS / stop ids masked) ->
repetition, frequency and presence penalties -> greedy argmax, or temperature -> min_p ->
top-k / top-p -> a draw from each row's generator. Every step is a [B, V] tensor op; Python
loops run over rows or over a request's listed token ids, never over the vocabulary.

Shapes: B rows (one per running sequence), V vocabulary (the model's logits width).
"""

from __future__ import annotations

import torch

from ..protocol import TokenLogprob
from .sequence import Sequence

LOGPROB_FLOOR = -9999.0  # log-probabilities of impossible tokens (-inf) are reported as this
NO_TOKEN = -1  # a row whose masks leave no token (the engine fails that request)


class Sampler:
    def __init__(self, eos_ids: frozenset[int] | set[int] = frozenset()):
        self.eos_ids = frozenset(eos_ids)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [B, V] (last position of each row). Returns one token id per row (NO_TOKEN
        where the row's constraints allow nothing)."""
        logits = self.process(logits.float(), seqs)  # [B, V]
        greedy = logits.argmax(-1)  # [B]
        dead = ~torch.isfinite(logits).any(-1)  # [B]
        out = torch.where(dead, NO_TOKEN, greedy)  # [B]
        live = [b for b, s in enumerate(seqs) if not s.params.is_greedy and not dead[b]]
        if not live:
            return out.tolist()
        probs = sampling_probs(logits[live], [seqs[b].params for b in live])  # [L, V]
        drawn = draw(probs, [seqs[b].generator for b in live]).tolist()  # [L]
        out = out.tolist()
        for b, tok in zip(live, drawn):
            out[b] = tok
        return out

    def process(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Everything that changes which tokens are possible or their order: logits [B, V] fp32."""
        if any(s.grammar is not None for s in seqs):
            from .grammar import apply_grammar_masks

            logits = logits.clone()  # the caller's logits give the reported (model) logprobs
            apply_grammar_masks(logits, [s.grammar for s in seqs])
        logits = apply_logit_bias(logits, seqs)
        logits = apply_min_tokens(logits, seqs, self.eos_ids)
        return apply_penalties(logits, seqs)


def stop_ids(seq: Sequence, eos_ids: frozenset[int]) -> set[int]:
    """Tokens that end the sequence: EOS (unless ignore_eos) and its stop_token_ids."""
    return (set() if seq.params.ignore_eos else set(eos_ids)) | set(seq.params.stop_token_ids)


def apply_logit_bias(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """logits [B, V] += each row's logit_bias (token ids past V are ignored: checked at admission)."""
    rows, toks, vals = [], [], []
    for b, seq in enumerate(seqs):
        for tok, bias in (seq.params.logit_bias or {}).items():
            rows.append(b)
            toks.append(tok)
            vals.append(bias)
    if not rows:
        return logits
    dev = logits.device
    return logits.index_put((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                            torch.tensor(vals, device=dev), accumulate=True)


def apply_min_tokens(logits: torch.Tensor, seqs: list[Sequence], eos_ids) -> torch.Tensor:
    """Mask EOS and stop_token_ids to -inf in rows that have fewer than min_tokens outputs.

    A row where that would leave no token (a finished grammar allows only EOS) keeps its logits:
    the grammar's end wins over min_tokens.
    """
    rows, toks = [], []
    for b, seq in enumerate(seqs):
        if len(seq.output_ids) < seq.params.min_tokens:
            ids = stop_ids(seq, eos_ids)
            rows += [b] * len(ids)
            toks += sorted(ids)
    if not rows:
        return logits
    dev = logits.device
    masked = logits.index_put((torch.tensor(rows, device=dev), torch.tensor(toks, device=dev)),
                              torch.tensor(-float("inf"), device=dev))  # [B, V]
    keep = torch.isfinite(masked).any(-1, keepdim=True)  # [B, 1]
    return torch.where(keep, masked, logits)


def apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Repetition (prompt + output tokens), then frequency and presence (output tokens).

    vLLM's definitions: a seen token's logit l becomes l / r if l > 0 else l * r; then
    l -= frequency * count + presence * (count > 0).
    """
    rows = [b for b, s in enumerate(seqs) if s.params.has_penalties]
    if not rows:
        return logits
    V, dev = logits.shape[-1], logits.device
    sub = [seqs[b] for b in rows]
    counts = token_counts([s.output_ids for s in sub], V, dev)  # [R, V]
    in_prompt = token_counts([s.prompt_ids for s in sub], V, dev) > 0  # [R, V]
    # NOTE: a penalty below float32's smallest normal (e.g. 5e-324, valid as a float64 > 0) would
    # round to 0 here: l * 0 of a masked -inf logit is NaN, l / 0 is inf. Clamp r into float32's
    # range and the penalised logits below its max, so every logit stays a number.
    rep = torch.tensor([s.params.repetition_penalty for s in sub], device=dev)[:, None]  # [R, 1]
    rep = rep.clamp_min(torch.finfo(rep.dtype).tiny)
    freq = torch.tensor([s.params.frequency_penalty for s in sub], device=dev)[:, None]  # [R, 1]
    pres = torch.tensor([s.params.presence_penalty for s in sub], device=dev)[:, None]  # [R, 1]
    x = logits[rows]  # [R, V]
    seen = in_prompt | (counts > 0)  # [R, V]
    x = torch.where(seen, torch.where(x > 0, (x / rep).clamp_max(torch.finfo(x.dtype).max),
                                      x * rep), x)
    x = x - freq * counts - pres * (counts > 0).float()
    logits = logits.clone()
    logits[rows] = x
    return logits


def token_counts(ids: list[list[int]], V: int, device) -> torch.Tensor:
    """[R, V] float: how often each token id occurs in each row's list."""
    width = max((len(r) for r in ids), default=0) + 1
    padded = torch.tensor([r + [V] * (width - len(r)) for r in ids], device=device)  # [R, W]
    counts = torch.zeros(len(ids), V + 1, device=device)  # [R, V + 1]: column V takes the pads
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :V]


def sampling_probs(logits: torch.Tensor, params: list) -> torch.Tensor:
    """Processed logits [L, V] of sampled rows -> probabilities after temperature, min_p, top-k
    and top-p."""
    dev = logits.device
    temp = torch.tensor([p.temperature for p in params], device=dev)  # [L]
    top_k = torch.tensor([p.top_k for p in params], device=dev)  # [L]
    top_p = torch.tensor([p.top_p for p in params], device=dev)  # [L]
    min_p = torch.tensor([p.min_p for p in params], device=dev)  # [L]
    logits = apply_min_p(logits / temp[:, None], min_p)  # [L, V]
    return torch.softmax(_filter(logits, top_k, top_p), -1)  # [L, V]


def draw(probs: torch.Tensor, generators: list) -> torch.Tensor:
    """One token per row of probs [L, V]: argmax(probs / q) with q ~ Exp(1), an exact draw from
    each row's distribution (as vLLM samples). Row i's noise comes from generators[i], or from the
    global generator for rows without one (drawn in one call)."""
    q = torch.empty_like(probs)  # [L, V]
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        q[shared] = torch.empty(len(shared), probs.shape[-1], device=probs.device).exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            q[i].exponential_(generator=g)
    q.clamp_(min=torch.finfo(q.dtype).tiny)  # q = 0 would make 0 / 0 = NaN win the argmax
    return (probs / q).argmax(-1)  # [L]


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p[b] times row b's top probability; [B, V]."""
    if not bool((min_p > 0).any()):
        return logits
    probs = torch.softmax(logits, -1)  # [B, V]
    floor = min_p[:, None] * probs.max(-1, keepdim=True).values  # [B, 1]
    return logits.masked_fill(probs < floor, -float("inf"))  # the top token always stays


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits [B, V] outside each row's top-k (k <= 0: off) and top-p nucleus to -inf.

    The nucleus is taken on the full distribution. Only the top max-k ranks of the rows that
    filter are sorted (topk), the whole row only when a row has top-p without top-k.
    """
    V = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # [B]
    active = (k < V) | (top_p < 1.0)  # [B]
    if not bool(active.any()):
        return logits
    width = int(k[active].max())
    top_v, top_i = logits.topk(width, -1)  # [B, W] best first
    rank = torch.arange(width, device=logits.device)[None, :]  # [1, W]
    drop = rank >= k[:, None]  # [B, W]
    probs = torch.exp(top_v - torch.logsumexp(logits, -1, keepdim=True))  # [B, W]
    before = probs.cumsum(-1) - probs  # [B, W] mass strictly above each rank
    # the top-1 token always stays (before = 0 < top_p); top_p = 1 drops nothing, even where the
    # float cumulative sum reaches 1.0 before the tail
    drop |= (before >= top_p[:, None]) & (top_p < 1.0)[:, None]
    drop[:, 0] = False  # also when top_p underflows to 0 in fp32 (schemathesis sent 5e-324)
    kept = torch.full_like(logits, -float("inf")).scatter_(-1, top_i, top_v.masked_fill(drop, -float("inf")))
    return torch.where(active[:, None], kept, logits)  # [B, V]


def token_logprobs(logits: torch.Tensor, token_ids: list[int], num_top: int) -> list[TokenLogprob]:
    """Model log-probabilities (before temperature) of token_ids and the top num_top alternatives.

    logits [N, V] finite, token_ids N ints. Every value is finite (>= LOGPROB_FLOOR), so the
    result always serialises to JSON.
    """
    logp = torch.log_softmax(logits.float(), -1).clamp_min(LOGPROB_FLOOR)  # [N, V] finite
    chosen = logp.gather(1, torch.tensor(token_ids, device=logp.device)[:, None])[:, 0]  # [N]
    top_v, top_i = logp.topk(num_top, -1) if num_top > 0 else (logp[:, :0], logp[:, :0].long())
    out = []
    for n, (tok, lp) in enumerate(zip(token_ids, chosen.tolist())):
        top = dict(zip(top_i[n].tolist(), top_v[n].tolist()))
        out.append(TokenLogprob(token_id=tok, logprob=lp, top=top))
    return out


def chosen_logprobs(logits: torch.Tensor, token_ids: list[int]) -> list[float]:
    """Model log-probabilities [N] of token_ids under logits [N, V] (floored like token_logprobs)."""
    logp = torch.log_softmax(logits.float(), -1)  # [N, V]
    idx = torch.tensor(token_ids, device=logp.device)[:, None]  # [N, 1]
    return logp.gather(1, idx)[:, 0].clamp_min(LOGPROB_FLOOR).tolist()
