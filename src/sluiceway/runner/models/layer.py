"""One decoder layer's weights on the device, built from canonical weights
(`weights`): q/k/v and gate/up fused into one `Linear` each, so a dense layer is
four matmuls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
import torch

from sluiceway.runner.linear import Int4Weight, Int8Weight, Linear
from sluiceway.runner.models.architecture import Architecture
from sluiceway.runner.models.experts import Expert, Experts
from sluiceway.runner.native.int8_dot import TiledWeight
from sluiceway.runner.quantization_choice import path_for_type


@attrs.frozen
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # hidden -> (H + 2 * KVH) * D
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear | None  # hidden -> 2 * intermediate; None with experts
    down: Linear | None
    q_norm: torch.Tensor | None = None  # [D], with `Architecture.qk_norm`
    k_norm: torch.Tensor | None = None
    experts: Experts | None = None
    # With `Architecture.gemma_norms` (then `post_norm` follows attention, and
    # every norm is `1 + weight` in float32, for `gemma_rms_norm`):
    pre_mlp_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None


def gemma_rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm with its `1 + weight` already in `scale` (float32): the
    product taken in float32 and rounded once, as transformers' Gemma2RMSNorm
    (Llama's rounds before the weight multiply)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * scale).to(x.dtype)


class StoredQuantized(Protocol):
    """A checkpoint's own quantized weights (`checkpoint.stored_int4.StoredBlocks`)."""

    def __call__(
        self, names: list[str], quantization: str | None = "int4"
    ) -> Int4Weight | Int8Weight | None:
        """The fused weight of a linear's canonical part names as path
        `quantization` (None: either) takes it stored, or None."""

    def rows(self, name: str) -> TiledWeight | None:
        """Weight `name` packed for reading rows back (the embedding), or None."""


class Weights:
    """Canonical weights moved to the device in `dtype`, with the errors a
    checkpoint that lacks one deserves. `stored` gives a linear the checkpoint's
    own quantized weight where it has one; `dense_copies` is `Linear`'s
    `dense_copy` for every quantized linear."""

    def __init__(
        self,
        weights: Mapping[str, torch.Tensor],
        dtype,
        device,
        *,
        stored: StoredQuantized | None = None,
        dense_copies: bool = False,
    ) -> None:
        self._weights, self._dtype, self._device = weights, dtype, device
        self.stored = stored
        self.dense_copies = dense_copies

    def linear(
        self,
        names: list[str],
        quantization: str | None,
        *,
        bias_names: list[str] | None = None,
        row_absmax: str | None = None,
    ) -> Linear:
        """The `Linear` of the fused weights `names` (and biases `bias_names`):
        from the checkpoint's own blocks where `quantization` takes them as
        stored (int4: Q4_0/Q4_1/Q4_K; int8: Q8_0), else quantized here as `quantization` says, but on int8
        where int4 would hold fewer bits than the checkpoint stores (a Q4_K_M
        GGUF's Q6_K projections: `stored_bits_path`)."""
        bias = self.fused(bias_names, required=False) if bias_names else None
        if quantization == "int4" and self.stored_bits_path(names) == "int8":
            quantization = "int8"
        if quantization in ("int4", "int8") and self.stored is not None:
            stored = self.stored(names, quantization)
            if stored is not None:
                return Linear.from_quantized(
                    stored, self._dtype, bias, dense_copy=self.dense_copies
                )
        weight = self.fused(names, required=True)
        # Rounded to the model's dtype like the weight: rounding is monotonic, so
        # that is the largest of the rounded weights, as one device computes it.
        absmax = self.get(row_absmax) if row_absmax is not None else None
        return Linear(
            weight,  # type: ignore[arg-type]
            bias,
            quantization=quantization,
            row_absmax=absmax,
            dense_copy=self.dense_copies,
        )

    def stored_bits_path(self, names: list[str]) -> str | None:
        """The weight-only path that keeps the detail of the finest stored part of
        `names` (`quantization_choice.path_for_type`): "int8" when one is stored
        in 5 to 8 bits, "int4" when all are stored in fewer, None when the
        checkpoint does not say (or stores one as floats)."""
        stored_type = getattr(self._weights, "stored_type", None)
        if stored_type is None:
            return None
        paths = {path_for_type(t) if (t := stored_type(n)) else None for n in names}
        if None in paths:
            return None
        return "int8" if "int8" in paths else "int4"

    def get(self, name: str) -> torch.Tensor | None:
        tensor = self._weights.get(name)
        if tensor is None:
            return None
        return tensor.to(device=self._device, dtype=self._dtype).contiguous()

    def need(self, name: str) -> torch.Tensor:
        tensor = self.get(name)
        if tensor is None:
            raise ValueError(f"checkpoint has no weight for {name!r}")
        return tensor

    def gemma_norm(self, name: str) -> torch.Tensor:
        """Gemma norm `name`'s scale, `1 + weight` in float32 (`gemma_rms_norm`)."""
        tensor = self._weights.get(name)
        if tensor is None:
            raise ValueError(f"checkpoint has no weight for {name!r}")
        return (1.0 + tensor.to(device=self._device, dtype=torch.float32)).contiguous()

    def fused(self, names: list[str], *, required: bool) -> torch.Tensor | None:
        parts = [self.get(n) for n in names]
        if any(p is None for p in parts):
            if required:
                missing = [n for n, p in zip(names, parts, strict=True) if p is None]
                raise ValueError(f"checkpoint has no weight for {', '.join(map(repr, missing))}")
            return None
        return torch.cat(parts, dim=0).contiguous()  # type: ignore[arg-type]


def layer_weights(arch: Architecture, w: Weights, i: int, quantization: str | None) -> LayerWeights:
    p = f"layers.{i}."
    q = quantization

    def linear(names: list[str]) -> Linear:
        return w.linear(
            [f"{p}{n}.weight" for n in names],
            q,
            bias_names=[f"{p}{n}.bias" for n in names],
            row_absmax=f"{p}{names[0]}.row_absmax" if len(names) == 1 else None,
        )

    experts = None
    gate_up = down = None
    if arch.is_moe(i):
        assert arch.experts is not None
        experts = Experts(
            shape=arch.experts,
            router=w.need(f"{p}router"),
            experts=[
                Expert(
                    gate_up=w.linear([f"{p}experts.{e}.gate", f"{p}experts.{e}.up"], q),
                    down=w.linear(
                        [f"{p}experts.{e}.down"],
                        q,
                        row_absmax=f"{p}experts.{e}.down.row_absmax",
                    ),
                )
                for e in range(arch.experts.num_experts)
            ],
        )
    else:
        gate_up, down = linear(["gate", "up"]), linear(["down"])
    norm = w.gemma_norm if arch.gemma_norms else w.need
    return LayerWeights(
        input_norm=norm(p + "input_norm"),
        qkv=linear(["q", "k", "v"]),
        o=linear(["o"]),
        post_norm=norm(p + "post_attention_norm"),
        gate_up=gate_up,
        down=down,
        q_norm=norm(p + "q_norm") if arch.qk_norm else None,
        k_norm=norm(p + "k_norm") if arch.qk_norm else None,
        experts=experts,
        pre_mlp_norm=norm(p + "pre_feedforward_norm") if arch.gemma_norms else None,
        post_mlp_norm=norm(p + "post_feedforward_norm") if arch.gemma_norms else None,
    )
