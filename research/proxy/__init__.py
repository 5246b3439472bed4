"""Proxy Qwen3-MoE model: corpus builder, tokenizer trainer and training script."""
