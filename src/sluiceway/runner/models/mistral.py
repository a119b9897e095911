"""Mistral: Llama's layer. Mistral 7B v0.1's sliding window of 4,096 tokens
(`sliding_window`) applies to every layer; the decoder attends within it once a
context outgrows it (`runner/masked_attention.py`)."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class MistralFamily(DecoderFamily):
    model_types = ("mistral",)


FAMILY = MistralFamily()
