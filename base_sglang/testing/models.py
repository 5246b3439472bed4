"""Build a tiny random MoE checkpoint (tokenizer + model + predictor) on disk, offline.

For tests, examples and benchmarks when the embedded proxy model is not there. The tokenizer is a
byte-level BPE trained on a few KB of built-in text with a ChatML chat template; the predictor has
random weights (it exercises the BASE code path, it predicts nothing).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..hf.families import FAMILIES

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_TEXT = """\
The quick brown fox jumps over the lazy dog. A mixture of experts layer routes every token to a few
of its experts; a batch of requests touches many more of them, and decoding is bound by reading their
weights from memory. Batch-aware selection keeps, for each layer and step, only the experts whose
removal would hurt the output most, and fills the freed slots with the next-preferred kept experts.
def add(a, b):
    return a + b
for i in range(10):
    print(i, add(i, i * 2))
Hello, world! How are you today? I am fine, thank you. What is the capital of France? Paris.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 100 1000 3.14159 2.71828.
"""


def create_tokenizer(path: Path, vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def create_tiny_moe(path: str | Path, arch: str = "qwen3_moe", num_experts: int = 8, top_k: int = 2,
                    num_layers: int = 2, hidden_size: int = 64, seed: int = 0,
                    with_predictor: bool = True, vocab_size: int | None = None) -> Path:
    """Write a tiny random `arch` MoE checkpoint to path; returns path."""
    from transformers import AutoModelForCausalLM

    from ..core import describe_model_config
    from ..hf import norm_topk_prob
    from .predictors import random_predictor

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = create_tokenizer(path)
    vocab = max(vocab_size or 0, len(tokenizer))  # ids past the tokenizer are never sampled much
    config = _config(arch, vocab, num_experts, top_k, num_layers, hidden_size)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    if with_predictor:
        d = describe_model_config(config)
        random_predictor(d["num_experts"], d["hidden_size"], d["top_k"], d["moe_layers"],
                         num_layers=d["num_layers"], seed=seed, architecture=type(model).__name__,
                         model_id=f"tiny-{arch}", norm_topk_prob=norm_topk_prob(config)
                         ).save(path / "predictor.safetensors")
    return path


def _config(arch, vocab, E, K, layers, H):
    from transformers import (
        DeepseekV2Config,
        MixtralConfig,
        OlmoeConfig,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    common = dict(vocab_size=vocab, hidden_size=H, intermediate_size=2 * H, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  initializer_range=0.1, tie_word_embeddings=False)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**common, head_dim=H // 4, moe_intermediate_size=H // 2,
                              num_experts=E, num_experts_per_tok=K, norm_topk_prob=True)
    if arch == "qwen2_moe":
        return Qwen2MoeConfig(**common, moe_intermediate_size=H // 2, num_experts=E,
                              num_experts_per_tok=K, shared_expert_intermediate_size=H)
    if arch == "olmoe":
        return OlmoeConfig(**common, num_experts=E, num_experts_per_tok=K)
    if arch == "mixtral":
        return MixtralConfig(**common, num_local_experts=E, num_experts_per_tok=K)
    if arch == "deepseek_v2":
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: no GQA
        return DeepseekV2Config(**common, moe_intermediate_size=H // 2, n_routed_experts=E,
                                num_experts_per_tok=K, n_shared_experts=1, first_k_dense_replace=0,
                                kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                                qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1)
    raise ValueError(f"arch: unknown {arch!r}; choose one of {', '.join(FAMILIES)}")
