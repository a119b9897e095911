"""Phi-3 and Phi-4 (mini): Llama's layer stored fused — q, k and v in one
`qkv_proj`, gate and up in one `gate_up_proj` — with RoPE over a
`partial_rotary_factor` of each head (Phi-4-mini) and longrope scaling."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway.runner.models.architecture import ModelShape
from sluiceway.runner.models.family import DecoderFamily
from sluiceway.runner.models.weights import WeightView, plain_views


class Phi3Family(DecoderFamily):
    model_types = ("phi3",)

    def layer_views(
        self, config, layer: int, prefix: str, state_dict: Mapping[str, Any]
    ) -> dict[str, WeightView]:
        s = ModelShape.from_config(config)
        q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        inter = config.intermediate_size
        canon = f"layers.{layer}."
        views = plain_views(
            {
                canon + "input_norm": prefix + "input_layernorm.weight",
                canon + "post_attention_norm": prefix + "post_attention_layernorm.weight",
                canon + "o.weight": prefix + "self_attn.o_proj.weight",
                canon + "down.weight": prefix + "mlp.down_proj.weight",
            },
            state_dict,
        )
        qkv = prefix + "self_attn.qkv_proj.weight"
        if qkv in state_dict:
            parts = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}
            for name, rows in parts.items():
                views[f"{canon}{name}.weight"] = WeightView(qkv, rows=rows)
        gate_up = prefix + "mlp.gate_up_proj.weight"
        if gate_up in state_dict:
            views[canon + "gate.weight"] = WeightView(gate_up, rows=(0, inter))
            views[canon + "up.weight"] = WeightView(gate_up, rows=(inter, 2 * inter))
        return views


FAMILY = Phi3Family()
