"""Temperature / top-k / top-p sampling with per-request generators, and token logprobs."""

from __future__ import annotations

import torch

from ..protocol import TokenLogprob
from .sequence import Sequence

LOGPROB_FLOOR = -9999.0  # log-probabilities of impossible tokens (-inf) are reported as this


class Sampler:
    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """logits [B, V] (last position of each row). Returns one token id per row."""
        logits = logits.float()  # [B, V]
        greedy = logits.argmax(-1)  # [B]
        if all(s.params.is_greedy for s in seqs):
            return greedy.tolist()
        dev = logits.device
        temp = torch.tensor([1.0 if s.params.is_greedy else s.params.temperature for s in seqs],
                            device=dev)  # [B]
        top_k = torch.tensor([s.params.top_k for s in seqs], device=dev)  # [B]
        top_p = torch.tensor([s.params.top_p for s in seqs], device=dev)  # [B]
        probs = torch.softmax(_filter(logits / temp[:, None], top_k, top_p), -1)  # [B, V]
        out = greedy.tolist()
        for b, seq in enumerate(seqs):
            if not seq.params.is_greedy:
                out[b] = int(torch.multinomial(probs[b], 1, generator=seq.generator))
        return out


def _filter(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask logits [B, V] outside each row's top-k (k <= 0: off) and top-p nucleus to -inf."""
    V = logits.shape[-1]
    sorted_logits, order = logits.sort(-1, descending=True)  # [B, V]
    rank = torch.arange(V, device=logits.device)[None, :]  # [1, V]
    k = torch.where(top_k > 0, top_k.clamp(max=V), torch.full_like(top_k, V))  # [B]
    drop = rank >= k[:, None]  # [B, V]
    probs = torch.softmax(sorted_logits, -1)  # [B, V]
    before = probs.cumsum(-1) - probs  # [B, V] mass strictly above each rank
    drop |= before >= top_p[:, None]
    drop[:, 0] = False  # the top-1 token always stays (also when top_p underflows to 0 in fp32)
    sorted_logits = sorted_logits.masked_fill(drop, -float("inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


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
