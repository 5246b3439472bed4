"""Startup refusals: SGLang configurations in which BASE would mis-select, named with their flag.

BASE needs, in every decode step, the whole batch's routed top-k of one MoE layer on every rank,
aligned row by row with the per-token budgets, and global expert ids handed to the Triton runner.
"""

from __future__ import annotations

# (attribute, is_unsupported(value), what to tell the operator)
_RULES = (
    ("ep_size", lambda v: (v or 1) > 1,
     "expert parallelism (--ep-size {v}): ranks would score different local experts"),
    ("moe_a2a_backend", lambda v: v not in (None, "none"),
     "--moe-a2a-backend {v} (DeepEP/all-to-all dispatch)"),
    ("enable_dp_attention", bool,
     "DP attention (--enable-dp-attention): MoE layers see tokens gathered from other DP ranks"),
    ("enable_eplb", bool, "EPLB (--enable-eplb): top-k ids become physical expert slots"),
    ("moe_runner_backend", lambda v: v not in ("triton", "auto"),
     "--moe-runner-backend {v}: BASE needs the Triton MoE runner (--moe-runner-backend triton)"),
    ("speculative_algorithm", lambda v: v is not None,
     "speculative decoding (--speculative-algorithm {v}): verify steps carry several tokens per request"),
    ("tokenizer_worker_num", lambda v: (v or 1) > 1,
     "--tokenizer-worker-num {v}: extra tokenizer workers do not load plugins, so the "
     "X-Expert-Budget header would be ignored"),
    ("enable_two_batch_overlap", bool,
     "two-batch overlap (--enable-two-batch-overlap): MoE layers see half batches"),
    ("enable_single_batch_overlap", bool, "single-batch overlap (--enable-single-batch-overlap)"),
    ("enable_torch_compile", bool,
     "--enable-torch-compile: the BASE hook is not verified under torch.compile"),
)


class UnsupportedConfig(ValueError):
    """An SGLang setting BASE cannot run under; the message names the flag."""


def check_server_args(server_args) -> None:
    """Raise UnsupportedConfig listing every unsupported setting of an SGLang ServerArgs."""
    problems = []
    for attr, bad, text in _RULES:
        value = getattr(server_args, attr, None)
        if bad(value):
            problems.append(text.format(v=value))
    if problems:
        raise UnsupportedConfig("BASE (BASE_PREDICTOR is set) cannot run with: " + "; ".join(problems)
                                + ". Change these settings or unset BASE_PREDICTOR.")


def check_model_runners(model, device: str) -> None:
    """After load: every bound MoE runner of a CUDA model must be Triton (auto may pick others)."""
    if device != "cuda":
        return
    from .compat import moe_runner_backends

    for name, backend in moe_runner_backends(model):
        if backend is not None and not backend.is_triton():
            raise UnsupportedConfig(
                f"BASE needs the Triton MoE runner, but {name} runs on {backend!s}; "
                f"launch with --moe-runner-backend triton")
