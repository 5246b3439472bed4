"""RequestOutputs of sequences: streamed deltas per choice, or (best_of > n) the n best at the end."""

from __future__ import annotations

from ..protocol import RequestOutput
from .sequence import Sequence


def delta_output(seq: Sequence, new_ids: list[int], text: str, num_experts: int,
                 error: str | None = None, index: int | None = None) -> RequestOutput:
    """The output of one choice for this step: its new tokens, text and logprobs."""
    executed, routed = seq.mean_experts()
    logprobs, seq.new_logprobs = (seq.new_logprobs if seq.params.logprobs is not None else None), []
    prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
    return RequestOutput(
        request_id=seq.request_id, token_ids=new_ids, text=text, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs, finished=seq.is_finished,
        finish_reason=seq.finish_reason, num_prompt_tokens=len(seq.prompt_ids),
        num_output_tokens=len(seq.output_ids), budget=min(seq.budget, num_experts),
        experts_per_layer=executed, experts_per_layer_routed=routed, error=error,
        index=seq.index if index is None else index,
        cumulative_logprob=seq.cumulative_logprob if seq.params.holds_outputs else None,
        queue_time_s=None if seq.scheduled_time is None else seq.scheduled_time - seq.arrival_time)


def hold(seq: Sequence) -> None:
    """best_of > n: keep this step's logprobs with the sequence until the group is ranked."""
    seq.held_logprobs += seq.new_logprobs
    seq.new_logprobs = []


def ranked_outputs(group: list[Sequence], num_experts: int,
                   error: str | None = None) -> list[RequestOutput]:
    """The n best sequences of a finished group by cumulative logprob (ties: lower index), each
    as one finished output re-indexed 0..n-1 with all its tokens, text and logprobs."""
    n = group[0].params.n
    if error is not None or any(s.finish_reason in ("error", "abort") for s in group):
        best = group[:n]  # nothing to rank: every choice reports the failure
    else:
        best = sorted(group, key=lambda s: (-s.cumulative_logprob, s.index))[:n]
    outs = []
    for i, seq in enumerate(best):
        seq.new_logprobs = seq.held_logprobs
        seq.held_logprobs = []
        text = seq.detokenizer.text
        outs.append(delta_output(seq, list(seq.output_ids), text, num_experts, error=error,
                                 index=i))
    return outs
