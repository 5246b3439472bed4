"""Tiny random MoE checkpoints of every supported family, a tiny BPE tokenizer and synthetic text.

Sizes (recorded): hidden 32, 8 routed experts, top-2, expert intermediate 16, vocab 300;
2 decoder layers (DeepSeek-V2: 3, layer 0 dense). Each checkpoint is ~0.1-0.3 MB on disk.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

FAMILIES = ("qwen3_moe", "qwen2_moe", "olmoe", "mixtral", "deepseek_v2")
WORDS = ("alpha beta gamma delta epsilon zeta theta kappa lambda sigma omega river stone cloud "
         "import return class def yield while print value index table query select where from "
         "the a of and to in is it that for on with as by at be this").split()


def tiny_config(family: str, vocab: int = 300):
    from transformers import (
        DeepseekV2Config,
        MixtralConfig,
        OlmoeConfig,
        Qwen2MoeConfig,
        Qwen3MoeConfig,
    )

    common = dict(vocab_size=vocab, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                  max_position_embeddings=256, num_experts_per_tok=2, tie_word_embeddings=False)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**common, num_hidden_layers=2, head_dim=16, intermediate_size=64,
                              moe_intermediate_size=16, num_experts=8, norm_topk_prob=True)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(**common, num_hidden_layers=2, intermediate_size=64,
                              moe_intermediate_size=16, shared_expert_intermediate_size=32,
                              num_experts=8, norm_topk_prob=False)
    if family == "olmoe":
        return OlmoeConfig(**common, num_hidden_layers=2, intermediate_size=16, num_experts=8)
    if family == "mixtral":
        return MixtralConfig(**common, num_hidden_layers=2, intermediate_size=16, num_local_experts=8)
    if family == "deepseek_v2":
        common["num_key_value_heads"] = 2  # MLA: one KV head per attention head
        return DeepseekV2Config(**common, num_hidden_layers=3, intermediate_size=64,
                                moe_intermediate_size=16, n_routed_experts=8, n_shared_experts=1,
                                first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                topk_method="greedy", n_group=1, topk_group=1)
    raise ValueError(family)


def synthetic_docs(n: int, words: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for d in range(n):
        topic = WORDS[d % len(WORDS)]  # give documents different word mixes
        docs.append(" ".join(rng.choice(WORDS) if rng.random() > 0.2 else topic for _ in range(words)))
    return docs


def write_text(path: Path, docs: list[str]) -> Path:
    path.write_text("\n<|endoftext|>\n".join(docs) + "\n")
    return path


def tiny_tokenizer(docs: list[str], vocab: int = 300):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def make_checkpoint(family: str, out: Path, docs: list[str], seed: int = 0) -> Path:
    """Save a tiny random model + tokenizer under out/ (loadable with AutoModelForCausalLM)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    tokenizer = tiny_tokenizer(docs)
    cfg = tiny_config(family, vocab=len(tokenizer))
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # spread router logits so routing is token-dependent and skewed
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    json.loads((out / "config.json").read_text())  # must be valid
    return out
