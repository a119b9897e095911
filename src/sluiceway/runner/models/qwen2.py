"""Qwen2 and Qwen2.5: Llama's layer with biases on q, k and v. Its sliding
window (`use_sliding_window`) is off in the released models; where it is on, it
applies to the layers from `max_window_layers` on, as `layer_types` says."""

from __future__ import annotations

from sluiceway.runner.models.family import DecoderFamily


class Qwen2Family(DecoderFamily):
    model_types = ("qwen2",)


FAMILY = Qwen2Family()
