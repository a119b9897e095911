"""Linear layers for the runner: plain, oneDNN-prepacked, or weight-only int8.

On CPU, `F.linear` in bfloat16 reorders the weight into oneDNN's blocked layout on
every call; for the 49152x576 output projection that reorder costs more than the
matmul (measured here: about 10 ms vs 2-4 ms per call, batch 1 to 32). Packing
once at load time removes it and gives bit-identical results. float32 keeps
`F.linear` (MKL), so float32 output stays exactly what transformers computes.

`quantization="int8"` stores each weight as int8 with one scale per output row
(symmetric, absmax) and multiplies with `torch._weight_int8pack_mm`, which reads a
quarter of float32's bytes: it wins at batch 1 (weight-bandwidth bound) and loses
at batch 8 and up, so it is an option, never a default.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QUANTIZATIONS = (None, "int8")


def _mkldnn_packable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.bfloat16, torch.float16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class Linear:
    """`y = x @ weight.T + bias` for `x [T, in]`, in the weight's dtype.

    `kind` says how `weight` is stored: "plain" (as given, `F.linear`), "mkldnn"
    (prepacked by oneDNN) or "int8" (int8 rows times `scales`)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        quantization: str | None = None,
    ) -> None:
        if quantization not in QUANTIZATIONS:
            raise ValueError(f"unknown quantization {quantization!r}; choose int8 or None")
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.dtype = weight.dtype
        self.scales = torch.ones(())
        if quantization == "int8":
            self.kind = "int8"
            w = weight.to(torch.float32)
            scales = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-10)
            self.weight = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
            self.scales = scales.to(weight.dtype)
        elif _mkldnn_packable(weight):
            self.kind = "mkldnn"
            # The batch-size hint only picks the blocked layout; any batch works.
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        else:
            self.kind = "plain"
            self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        if self.kind == "int8":
            out = torch._weight_int8pack_mm(x, self.weight, self.scales)
            return out if self.bias is None else out + self.bias
        return F.linear(x, self.weight, self.bias)
