"""Rotary position embeddings as transformers computes them: the inverse
frequencies at model init, and the rotate-half rotation of a head's leading
`rotary_dim` dimensions."""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sluiceway.runner.models.architecture import UnsupportedModel


def rope_parameters(config, kind: str | None = None) -> dict:
    """The config's RoPE parameters (`rope_parameters`, transformers 5; those of
    layer type `kind` where the config keeps one set per layer type, as Gemma 3's),
    with `rope_type` checked: an unknown type raises `UnsupportedModel` naming it."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    field = "rope_parameters"
    if kind is not None:
        params, field = dict(params.get(kind) or {}), f"rope_parameters.{kind}"
    rope_type = params.get("rope_type", "default")
    if rope_type != "default" and rope_type not in ROPE_INIT_FUNCTIONS:
        raise UnsupportedModel(
            f"{config.model_type}: {field}.rope_type {rope_type!r} is not supported"
        )
    return params


def rotary_dim(config, head_dim: int) -> int:
    """How many leading dimensions of a head RoPE rotates."""
    factor = rope_parameters(config).get(
        "partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)
    )
    return int(head_dim * (factor or 1.0))


def rope_frequencies(
    config, head_dim: int, kind: str | None = None
) -> tuple[torch.Tensor, float]:
    """`(inv_freq [rotary_dim // 2] float32, attention_scaling)` exactly as
    transformers computes them at model init (for layer type `kind`'s parameters
    where there is one set per type). Dynamic-NTK and longrope scaling use their
    init-time frequencies, which match transformers within the original context."""
    params = rope_parameters(config, kind)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        dim = rotary_dim(config, head_dim)
        inv_freq = 1.0 / (
            base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim)
        )
        return inv_freq, 1.0
    extra = {} if kind is None else {"layer_type": kind}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None, **extra)
    return inv_freq.to(torch.float32), float(scaling)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of `x [T, heads, D]`'s leading `cos.shape[-1]` dimensions;
    cos/signed_sin `[T, 1, rotary_dim]`.

    transformers computes `x * cos + cat(-x2, x1) * sin`; with the sign folded into
    `signed_sin` (first half negated, see `DecoderModel.rope_tables`) that is
    `x * cos + roll(x) * signed_sin`: the same products bit for bit, in 4 ops
    instead of 6. Dimensions past `rotary_dim` pass through."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + x.roll(r // 2, dims=-1) * signed_sin
    rot = x[..., :r]
    return torch.cat((rot * cos + rot.roll(r // 2, dims=-1) * signed_sin, x[..., r:]), dim=-1)
