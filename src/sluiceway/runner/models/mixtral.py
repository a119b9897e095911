"""Mixtral: Mistral's attention with a mixture of SwiGLU experts in every layer,
the router's top-k softmax weights always renormalised and kept in float32."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway.runner.models.architecture import ExpertsShape
from sluiceway.runner.models.experts import expert_views
from sluiceway.runner.models.family import DecoderFamily
from sluiceway.runner.models.weights import WeightView


class MixtralFamily(DecoderFamily):
    model_types = ("mixtral",)

    def experts(self, config) -> ExpertsShape:
        return ExpertsShape(
            num_experts=config.num_local_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.intermediate_size,
            normalize_top_k=True,
            float32_weights=True,
        )

    def moe_layers(self, config) -> tuple[bool, ...]:
        return (True,) * config.num_hidden_layers

    def layer_views(
        self, config, layer: int, prefix: str, state_dict: Mapping[str, Any]
    ) -> dict[str, WeightView]:
        views = super().layer_views(config, layer, prefix, state_dict)
        views.update(expert_views(self.experts(config), layer, prefix + "mlp.", state_dict))
        return views


FAMILY = MixtralFamily()
