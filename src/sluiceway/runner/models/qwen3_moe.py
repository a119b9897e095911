"""Qwen3-MoE: Qwen3's attention (q/k norms) with a mixture of SwiGLU experts in
the layers its config makes sparse (`decoder_sparse_step`, `mlp_only_layers`);
the router's top-k softmax weights renormalised when `norm_topk_prob`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway.runner.models.architecture import ExpertsShape
from sluiceway.runner.models.experts import expert_views
from sluiceway.runner.models.family import DecoderFamily
from sluiceway.runner.models.weights import WeightView


class Qwen3MoeFamily(DecoderFamily):
    model_types = ("qwen3_moe",)
    qk_norm = True

    def experts(self, config) -> ExpertsShape:
        return ExpertsShape(
            num_experts=config.num_experts,
            top_k=config.num_experts_per_tok,
            intermediate_size=config.moe_intermediate_size,
            normalize_top_k=bool(config.norm_topk_prob),
        )

    def moe_layers(self, config) -> tuple[bool, ...]:
        step = config.decoder_sparse_step
        dense = set(config.mlp_only_layers or ())
        return tuple(
            i not in dense and config.num_experts > 0 and (i + 1) % step == 0
            for i in range(config.num_hidden_layers)
        )

    def layer_views(
        self, config, layer: int, prefix: str, state_dict: Mapping[str, Any]
    ) -> dict[str, WeightView]:
        views = super().layer_views(config, layer, prefix, state_dict)
        if self.moe_layers(config)[layer]:
            views.update(expert_views(self.experts(config), layer, prefix + "mlp.", state_dict))
        return views


FAMILY = Qwen3MoeFamily()
