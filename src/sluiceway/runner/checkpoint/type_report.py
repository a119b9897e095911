"""One start-up log line: what each stored tensor type of a checkpoint is served as."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sluiceway.runner.checkpoint.stored_int4 import STORED_BLOCK_TYPES, int8_blocks_served
from sluiceway.runner.quantization_choice import path_for_type

_FLOAT_NAMES = {"F32", "F16", "BF16", "F64"}
_INT4_BLOCK_NAMES = STORED_BLOCK_TYPES["int4"]
_INT8_BLOCK_NAMES = STORED_BLOCK_TYPES["int8"]


def _role(name: str) -> str:
    if name in ("model.embed_tokens.weight",):
        return "embedding"
    if name == "lm_head.weight":
        return "output head"
    if "norm" in name or name.endswith(".bias") or name.endswith("mlp.gate.weight"):
        return "norms, biases, routers"
    return "layer linears"


def stored_types_report(loaded: Any, quantization: str | None, from_blocks: bool) -> str:
    """e.g. "stored Q4_0 layer linears (196) -> int4 from the stored blocks; Q6_K
    output head (1) -> int8 (dequantized, requantized per row); F32 norms (65) ->
    bfloat16". `quantization` is the path the layers take, `from_blocks` whether
    they keep the stored 4-bit blocks (`stored_int4`)."""
    dtype = str(loaded.dtype).removeprefix("torch.")
    groups: dict[tuple[str, str], int] = defaultdict(int)
    for name, tensor in loaded.state_dict().items():
        groups[(getattr(tensor, "type_name", "?"), _role(name))] += 1
    # Q8_0 blocks are kept where the int8 tiles serve the dtype (`stored_int4`).
    int8_blocks = from_blocks and int8_blocks_served(loaded.dtype)
    tied = getattr(loaded.hf_config, "tie_word_embeddings", False)
    # On int4, layer linears stored in 5 to 8 bits are served on int8, and so is
    # every part fused with one (`models.layer.Weights.linear`).
    finer = quantization == "int4" and any(
        role == "layer linears" and path_for_type(kind) == "int8" for kind, role in groups
    )
    parts = []
    for (kind, role), count in sorted(groups.items()):
        served = _served(kind, role, quantization, from_blocks, int8_blocks, dtype, tied)
        if finer and role == "layer linears" and served.startswith("int4"):
            served += ", int8 where fused with a part stored in more bits"
        parts.append(f"{kind} {role} ({count}) -> {served}")
    return "stored " + "; ".join(parts)


def _served(
    kind: str,
    role: str,
    quantization: str | None,
    from_blocks: bool,
    int8_blocks: bool,
    dtype: str,
    tied: bool,
) -> str:
    def path(q: str) -> str:
        if q == "int4" and from_blocks and kind in _INT4_BLOCK_NAMES:
            return "int4 from the stored blocks"
        if q == "int8" and int8_blocks and kind in _INT8_BLOCK_NAMES:
            return "int8 from the stored blocks"
        if kind in _FLOAT_NAMES:
            return f"{q} (quantized from the stored floats)"
        return f"{q} (dequantized, requantized)"

    if role == "layer linears" and quantization is not None:
        if quantization == "int4" and path_for_type(kind) == "int8":
            return path("int8") + ", its stored bits kept"
        return path(quantization)
    head = "int8" if quantization == "int4" else quantization
    if role == "output head" and head is not None:
        return path(
            "int4" if quantization == "int4" and from_blocks and kind in _INT4_BLOCK_NAMES else head
        )
    if role == "embedding":
        tail = f", and the tied output head {path(head)}" if tied and head is not None else ""
        if quantization == "int8" and int8_blocks and kind in _INT8_BLOCK_NAMES:
            tail = ", and the tied output head int8 from them" if tied else ""
            return f"its stored blocks, token rows read back in {dtype}{tail}"
        if quantization == "int4" and from_blocks and kind in _INT4_BLOCK_NAMES:
            # `models.decoder`: looked up in its blocks (and the tied head's int4).
            tail = ", and the tied output head int4 from them" if tied else ""
            return f"its stored blocks, token rows read back in {dtype}{tail}"
        return f"{dtype} (dequantized){tail}" if kind not in _FLOAT_NAMES else f"{dtype}{tail}"
    return dtype if kind in _FLOAT_NAMES else f"{dtype} (dequantized)"
