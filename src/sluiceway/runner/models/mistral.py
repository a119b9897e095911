"""Mistral: Llama's layer. Mistral 7B v0.1's sliding window of 4,096 tokens is
honoured by holding the context within one window (`loading`), where full and
sliding attention agree."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class MistralFamily(DecoderFamily):
    model_types = ("mistral",)


FAMILY = MistralFamily()
