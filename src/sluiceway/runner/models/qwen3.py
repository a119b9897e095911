"""Qwen3 (dense): Llama's layer with an RMSNorm over each query and key head
before RoPE (`q_norm`, `k_norm`)."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class Qwen3Family(DecoderFamily):
    model_types = ("qwen3",)
    qk_norm = True


FAMILY = Qwen3Family()
