"""Which weight path a model is served on when the user leaves `--quantization auto`.

A GGUF file says how each tensor is stored. When its linear weights are stored
quantized, serving them in 16 or 32 bits keeps exactly the same (dequantized)
values but reads two to eight times the weight bytes per decode step, and a CPU
decode step is bound by those bytes. So on CPU, "auto" serves a model on the
weight-only path its stored types fit: 4- and 5-bit types (and anything coarser)
on int4, whose groups of 32 with a scale and an offset hold Q4_0's and Q4_1's
blocks as stored (`checkpoint/stored_int4.py`) and the other 4-bit types
closely; 5-, 6- and 8-bit types on int8 (one scale a row: no fewer bits a
weight than stored, though Q8_0's and the K-quants' finer-grained scales are
requantized to the row's). On int4, a layer linear stored in 5 to 8 bits
is served on int8 all the same (`models.layer.Weights.linear`). Float weights
(safetensors, or a GGUF of F32/F16/BF16) stay unquantized, as does everything on
CUDA, where the quantized kernels do not run.

The quantized path is only fast where the native kernels serve it: bfloat16
activations on a CPU with AVX512-BF16 (`native/quantized_matvec.c`), or float32
activations on a CPU with AVX2 and FMA (`native/quantized_matmul_f32.c`).
Elsewhere the weight-only products fall back to torch's
`_weight_int4pack_mm_for_cpu` and `_weight_int8pack_mm`, which in float32 on an
AVX2-only CPU take many times as long per call as the float32 product they
replace (`benchmarks/linear_paths.py`). So there "auto"
keeps the weights unquantized and says why.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import attrs
import torch

# GGML type names (gguf.GGMLQuantizationType) by the path that keeps their detail.
INT8_TYPES = frozenset({"Q8_0", "Q8_1", "Q8_K", "Q6_K", "Q5_0", "Q5_1", "Q5_K"})
FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})
# Everything else that is not an integer type is a block type of at most 4 bits a
# weight (Q4_*, Q2_K, Q3_K, IQ*, TQ*): int4.
NON_WEIGHT_TYPES = frozenset({"I8", "I16", "I32", "I64"})

# The projections a layer runs through `Linear` (GGUF tensor names blk.N.<name>.weight).
LINEAR_NAMES = frozenset(
    {"attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"}
)
EXPERT_NAMES = frozenset({"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})


@attrs.frozen
class QuantizationChoice:
    """The path a model is served on (`quantization`: None, "int8" or "int4") and a
    one-line reason, for the start-up log."""

    quantization: str | None
    reason: str


def gguf_linear_weight_types(path: Path) -> Counter[str]:
    """Parameters of the layers' linear weights in the GGUF file at `path`, by GGML
    type name (e.g. `{"Q4_1": 134_000_000}`). Reads the tensor index only; the data is
    memory-mapped, not read."""
    from sluiceway.runner.checkpoint.gguf_file import GGUFFile

    return linear_weight_types(GGUFFile.open(path))


def linear_weight_types(file) -> Counter[str]:
    """`gguf_linear_weight_types` of an opened `checkpoint.gguf_file.GGUFFile`."""
    counts: Counter[str] = Counter()
    for name, tensor in file.tensors.items():
        parts = name.split(".")
        if (
            len(parts) == 4
            and parts[0] == "blk"
            and (parts[2] in LINEAR_NAMES or parts[2] in EXPERT_NAMES)
            and parts[3] == "weight"
        ):
            counts[tensor.type_name] += tensor.n_elements
    return counts


def path_for_type(type_name: str) -> str | None:
    """The weight-only path that keeps a GGML type's detail: None for float types."""
    if type_name in FLOAT_TYPES or type_name in NON_WEIGHT_TYPES:
        return None
    return "int8" if type_name in INT8_TYPES else "int4"


_NO_NATIVE = (
    "the native int4/int8 kernels need bfloat16 on an AVX512-BF16 CPU or float32 on an "
    "AVX2+FMA CPU; torch's fallback is several times slower than unquantized here"
)


def choose_quantization(
    requested: str | None,
    *,
    device: str,
    gguf_path: Path | None,
    native_kernels: bool,
    linear_types: Counter[str] | None = None,
) -> QuantizationChoice:
    """The path for a model, given what was asked for (`"auto"`, `"none"` or None,
    `"int8"`, `"int4"`), the device, the GGUF file the weights come from (None: a
    Hugging Face directory) and whether the native quantized kernels serve this
    dtype on this CPU. An explicit path is kept as asked (the runner refuses it off
    the CPU; the reason warns when it will be slow); "auto" decides from the type
    that holds the majority of the linear weights' parameters, and only takes a
    quantized path the native kernels serve. `linear_types`: the file's
    `gguf_linear_weight_types` where the caller has them already. Raises
    `ValueError` for an unknown request."""
    if requested in (None, "none"):
        return QuantizationChoice(None, "--quantization none: weights served unquantized")
    if requested in ("int8", "int4"):
        slow = "" if native_kernels or device != "cpu" else f"; slow here: {_NO_NATIVE}"
        return QuantizationChoice(requested, f"--quantization {requested} asked for{slow}")
    if requested != "auto":
        raise ValueError(f"unknown quantization {requested!r}; use auto, none, int8 or int4")
    if device != "cpu":
        return QuantizationChoice(
            None, f"auto on {device}: the weight-only quantized kernels run on CPU only"
        )
    if gguf_path is None:
        return QuantizationChoice(None, "auto: the weights are stored as floats (not a GGUF)")
    counts = gguf_linear_weight_types(gguf_path) if linear_types is None else linear_types
    if not counts:
        return QuantizationChoice(None, f"auto: no layer linear weights found in {gguf_path.name}")
    majority, params = counts.most_common(1)[0]
    share = params / sum(counts.values())
    stored = f"{share:.0%} of the linear weights' parameters in {gguf_path.name} are {majority}"
    path = path_for_type(majority)
    if path is None:
        return QuantizationChoice(None, f"auto: {stored}, stored as floats")
    if not native_kernels:
        return QuantizationChoice(None, f"auto: {stored}, but {_NO_NATIVE}")
    return QuantizationChoice(path, f"auto: {stored}, stored quantized")


def native_quantized_kernels(dtype: torch.dtype, device: str) -> bool:
    """Whether the native int4/int8 kernels serve a model in `dtype` on `device` here
    (compiles them on first call): bfloat16 with AVX512-BF16, float32 with AVX2."""
    from sluiceway.runner.native.quantized_matmul_f32 import quantized_matmul_f32_available
    from sluiceway.runner.native.quantized_matvec import int8_matvec_available

    if device != "cpu":
        return False
    if dtype == torch.bfloat16:
        return int8_matvec_available(32)
    return dtype == torch.float32 and quantized_matmul_f32_available()
