"""Gemma 2: embeddings scaled by sqrt(hidden_size), RMSNorms that scale by
`1 + weight` and also follow attention and the MLP, a GELU (tanh) MLP, queries
scaled by `query_pre_attn_scalar`, sliding-window attention on the layers
`layer_types` marks, and soft-capped attention and output logits."""

from __future__ import annotations

import attrs

from sluiceway.runner.models.architecture import Architecture
from sluiceway.runner.models.family import DecoderFamily


class Gemma2Family(DecoderFamily):
    model_types = ("gemma2",)
    activations = ("gelu_pytorch_tanh",)
    activation_field = "hidden_activation"

    def adapt(self, config, architecture: Architecture) -> Architecture:
        return attrs.evolve(
            architecture,
            attn_softcap=getattr(config, "attn_logit_softcapping", None),
            final_softcap=getattr(config, "final_logit_softcapping", None),
            embed_scale=config.hidden_size**0.5,
            gemma_norms=True,
        )


FAMILY = Gemma2Family()
