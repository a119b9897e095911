"""`DecoderFamily`: what one model family declares — the config types it reads,
how its config maps onto an `Architecture`, and where its checkpoint keeps each
canonical weight (`weights`). The defaults are Llama's; a family overrides what
differs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluiceway.runner.models.architecture import (
    Architecture,
    ExpertsShape,
    ModelShape,
    UnsupportedModel,
)
from sluiceway.runner.models.rope import rope_parameters, rotary_dim
from sluiceway.runner.models.weights import WeightView, plain_views

__all__ = ["DecoderFamily", "UnsupportedModel"]


_LAYER_NAMES = {
    "input_norm": "input_layernorm.weight",
    "post_attention_norm": "post_attention_layernorm.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    **{f"{p}.{kind}": f"self_attn.{p}_proj.{kind}" for p in "qkvo" for kind in ("weight", "bias")},
    **{
        f"{p}.{kind}": f"mlp.{p}_proj.{kind}"
        for p in ("gate", "up", "down")
        for kind in ("weight", "bias")
    },
}


class DecoderFamily:
    """A family of decoder-only models laid out as Llama's checkpoints are
    (`model.layers.{i}.self_attn.q_proj`, ...). Subclasses override the hooks
    where their family differs."""

    #: The transformers `model_type`s this family serves.
    model_types: tuple[str, ...] = ()
    #: Activations the family's MLP may use (transformers' `hidden_act` names).
    activations: tuple[str, ...] = ("silu",)

    def architecture(self, config) -> Architecture:
        """The config as the forward pass runs it; `UnsupportedModel` naming the
        field for anything this family does not implement."""
        self.check(config)
        shape = ModelShape.from_config(config)
        return Architecture(
            model_type=config.model_type,
            shape=shape,
            rotary_dim=rotary_dim(config, shape.head_dim),
            rope_layers=self.rope_layers(config),
            qk_norm=self.qk_norm,
            experts=self.experts(config),
            moe_layers=self.moe_layers(config),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        )

    qk_norm: bool = False

    def check(self, config) -> None:
        act = getattr(config, "hidden_act", "silu")
        if act not in self.activations:
            raise UnsupportedModel(
                f"{config.model_type}: hidden_act {act!r} is not supported "
                f"(supported: {', '.join(self.activations)})"
            )
        rope_parameters(config)  # raises for an unknown rope_type

    def rope_layers(self, config) -> tuple[bool, ...]:
        return (True,) * config.num_hidden_layers

    def experts(self, config) -> ExpertsShape | None:
        return None

    def moe_layers(self, config) -> tuple[bool, ...]:
        return ()

    def weight_views(self, config, state_dict: Mapping[str, Any]) -> dict[str, WeightView]:
        """Canonical name -> where `state_dict` keeps it, for the weights the
        checkpoint has (the decoder says which of the missing ones it needed)."""
        views = plain_views(
            {
                "embed": "model.embed_tokens.weight",
                "final_norm": "model.norm.weight",
                "lm_head": "lm_head.weight",
            },
            state_dict,
        )
        if getattr(config, "tie_word_embeddings", False):
            views.pop("lm_head", None)
        for i in range(config.num_hidden_layers):
            views.update(self.layer_views(config, i, f"model.layers.{i}.", state_dict))
        return views

    def layer_views(
        self, config, layer: int, prefix: str, state_dict: Mapping[str, Any]
    ) -> dict[str, WeightView]:
        return plain_views(
            {f"layers.{layer}.{canon}": prefix + name for canon, name in _LAYER_NAMES.items()},
            state_dict,
        )
