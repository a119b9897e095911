"""Llama 2/3.x: the reference layout (RMSNorm, RoPE with transformers' scaling
types, grouped-query attention, SwiGLU). Optional biases (`attention_bias`,
`mlp_bias`) load when the checkpoint has them."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class LlamaFamily(DecoderFamily):
    model_types = ("llama",)


FAMILY = LlamaFamily()
