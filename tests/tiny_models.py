"""The shape of the tiny random Llama that runner, kernel, integration and API
tests build (2 layers, 4 query heads over 2 KV heads, head_dim 16). Each test adds
its own vocabulary and special tokens with `dict(TINY_LLAMA, ...)`."""

from __future__ import annotations

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
