"""SmolLM3: Llama's layer, with RoPE left out of the layers its config marks 0
in `no_rope_layers` (every fourth, in the released model)."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class SmolLM3Family(DecoderFamily):
    model_types = ("smollm3",)

    def rope_layers(self, config) -> tuple[bool, ...]:
        flags = getattr(config, "no_rope_layers", None) or [1] * config.num_hidden_layers
        return tuple(bool(flag) for flag in flags[: config.num_hidden_layers])


FAMILY = SmolLM3Family()
