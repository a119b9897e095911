"""Gemma 3, text only (`Gemma3ForCausalLM`, model type gemma3_text): Gemma 2's
layer with q/k RMSNorms, no soft caps by default, and one RoPE table per layer
type (local sliding layers and global layers rotate with different bases)."""

from __future__ import annotations

import attrs

from sluiceway.runner.models.architecture import Architecture, UnsupportedModel
from sluiceway.runner.models.gemma2 import Gemma2Family
from sluiceway.runner.models.rope import rope_parameters


class Gemma3Family(Gemma2Family):
    model_types = ("gemma3_text",)
    qk_norm = True

    def check(self, config) -> None:
        super().check(config)
        if getattr(config, "use_bidirectional_attention", False):
            raise UnsupportedModel(
                f"{config.model_type}: use_bidirectional_attention is not supported "
                "(an encoder, not a decoder)"
            )
        for layer_type in set(config.layer_types):
            rope_parameters(config, layer_type)  # raises for an unknown rope_type

    def adapt(self, config, architecture: Architecture) -> Architecture:
        return attrs.evolve(
            super().adapt(config, architecture),
            rope_kinds=tuple(config.layer_types[: config.num_hidden_layers]),
        )


FAMILY = Gemma3Family()
