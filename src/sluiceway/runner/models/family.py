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
    "pre_feedforward_norm": "pre_feedforward_layernorm.weight",  # Gemma
    "post_feedforward_norm": "post_feedforward_layernorm.weight",
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
        return self.adapt(config, Architecture(
            model_type=config.model_type,
            shape=shape,
            rotary_dim=rotary_dim(config, shape.head_dim),
            rope_layers=self.rope_layers(config),
            qk_norm=self.qk_norm,
            experts=self.experts(config),
            moe_layers=self.moe_layers(config),
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            layer_windows=self.layer_windows(config),
            activation=self.activation(config),
        ))

    qk_norm: bool = False
    #: The config field naming the MLP's activation.
    activation_field = "hidden_act"

    def adapt(self, config, architecture: Architecture) -> Architecture:
        """What the family changes in the architecture read as Llama's."""
        return architecture

    def activation(self, config) -> str:
        return getattr(config, self.activation_field, None) or "silu"

    def check(self, config) -> None:
        act = self.activation(config)
        if act not in self.activations:
            raise UnsupportedModel(
                f"{config.model_type}: {self.activation_field} {act!r} is not supported "
                f"(supported: {', '.join(self.activations)})"
            )
        rope_parameters(config)  # raises for an unknown rope_type
        for layer_type in getattr(config, "layer_types", None) or ():
            if layer_type not in ("full_attention", "sliding_attention"):
                raise UnsupportedModel(
                    f"{config.model_type}: layer_types entry {layer_type!r} is not supported "
                    "(supported: full_attention, sliding_attention)"
                )

    def layer_windows(self, config) -> tuple[int | None, ...]:
        """Each layer's sliding window, as transformers applies `sliding_window`:
        to the layers `layer_types` marks "sliding_attention" where the config has
        layer types (and `use_sliding_window` is not off), else to every layer.
        Empty when no layer has one."""
        window = getattr(config, "sliding_window", None)
        if not window or not getattr(config, "use_sliding_window", True):
            return ()
        n = config.num_hidden_layers
        types = getattr(config, "layer_types", None)
        if types is None:
            return (int(window),) * n
        windows = tuple(int(window) if t == "sliding_attention" else None for t in types[:n])
        return windows if any(w is not None for w in windows) else ()

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
