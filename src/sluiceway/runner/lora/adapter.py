"""One PEFT LoRA adapter, read from its directory and laid out for our fused linears.

A PEFT directory holds `adapter_config.json` (rank `r`, `lora_alpha`,
`target_modules`, `use_rslora`) and `adapter_model.safetensors`, whose tensors
are named `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`
(`[r, in]`) and `...lora_B.weight` (`[out, r]`). The runner fuses q/k/v into
one `qkv` linear and gate/up into one `gate_up` (`models/layer.py`), so each
target's A is stacked with its neighbours' and its B placed, block-diagonally,
into that target's rows of the fused output: one pair of small matmuls per fused
linear gives every target's delta, and rows of untargeted slices stay zero.
The scaling (`lora_alpha / r`, or `/ sqrt(r)` with rsLoRA) is folded into B.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import attrs
import torch
from safetensors import safe_open

from sluiceway.runner.models.architecture import ModelShape

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

# A PEFT target module -> (our fused linear, which of its slices; None: all of it).
# Phi-3 names its fused linears `qkv_proj` and `gate_up_proj` itself.
TARGETS: dict[str, tuple[str, int | None]] = {
    "q_proj": ("qkv", 0),
    "k_proj": ("qkv", 1),
    "v_proj": ("qkv", 2),
    "qkv_proj": ("qkv", None),
    "o_proj": ("o", None),
    "gate_proj": ("gate_up", 0),
    "up_proj": ("gate_up", 1),
    "gate_up_proj": ("gate_up", None),
    "down_proj": ("down", None),
}
LINEARS = ("qkv", "o", "gate_up", "down")

_NAME = re.compile(
    r"^(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.weight)?$"
)


class AdapterError(ValueError):
    """An adapter this model cannot serve; the message names the problem."""


@attrs.frozen
class LoraPair:
    """The delta of one fused linear: `x @ a.T @ b.T`, with `a` `[R, in]` and `b`
    `[out, R]` (scaling folded in), in the activation dtype."""

    a: torch.Tensor
    b: torch.Tensor


@attrs.frozen
class LoraAdapter:
    """An adapter's pairs by (layer index, fused linear name); a linear it does not
    target has none."""

    name: str
    rank: int
    pairs: dict[tuple[int, str], LoraPair]

    @property
    def nbytes(self) -> int:
        return sum(p.a.nbytes + p.b.nbytes for p in self.pairs.values())


def _slices(shape: ModelShape, inter: int) -> dict[str, tuple[int, list[int]]]:
    """Each fused linear's (input features, output slice sizes)."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    return {
        "qkv": (shape.hidden_size, [q, kv, kv]),
        "o": (q, [shape.hidden_size]),
        "gate_up": (shape.hidden_size, [inter, inter]),
        "down": (inter, [shape.hidden_size]),
    }


def read_config(directory: Path) -> dict:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise AdapterError(f"LoRA adapter {str(directory)!r} has no {CONFIG_FILE}")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"LoRA adapter {str(directory)!r}: unreadable {CONFIG_FILE}: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"LoRA adapter {str(directory)!r}: {CONFIG_FILE} is not an object")
    return config


def load_adapter(
    name: str,
    directory: str | Path,
    shape: ModelShape,
    *,
    intermediate_size: int,
    max_rank: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    moe_layers: frozenset[int] = frozenset(),
) -> LoraAdapter:
    """The adapter in PEFT `directory`, checked against a base model of `shape`
(whose dense MLPs have `intermediate_size` features).

    Raises `AdapterError` naming the problem: a missing file, a rank above
    `max_rank`, a target module this runner has no linear for (or an MLP target
    on a layer in `moe_layers`, whose experts take no adapter), a tensor whose
    shape does not fit the base model, or a layer the base model lacks.
    """
    directory = Path(directory)
    config = read_config(directory)
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"LoRA adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = int(config.get("r", 0))
    if rank <= 0:
        raise AdapterError(f"LoRA adapter {name!r}: rank r={rank} is not positive")
    if rank > max_rank:
        raise AdapterError(
            f"LoRA adapter {name!r} has rank {rank}, above --max-lora-rank {max_rank}"
        )
    alpha = float(config.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    targets = config.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    unsupported = sorted(set(targets) - set(TARGETS))
    if unsupported:
        raise AdapterError(
            f"LoRA adapter {name!r} targets unsupported module(s) {', '.join(unsupported)} "
            f"(supported: {', '.join(TARGETS)})"
        )
    for key in ("modules_to_save", "layers_to_transform"):
        if config.get(key):
            raise AdapterError(f"LoRA adapter {name!r}: {key} is not supported")
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise AdapterError(f"LoRA adapter {name!r} has no {WEIGHTS_FILE} in {str(directory)!r}")

    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(weights_path), framework="pt") as f:
        for key in f.keys():
            match = _NAME.match(key)
            if match is None:
                raise AdapterError(f"LoRA adapter {name!r}: unexpected tensor {key!r}")
            layer, module, which = int(match[1]), match[2], match[3]
            if module not in TARGETS:
                raise AdapterError(f"LoRA adapter {name!r} targets unsupported module {module!r}")
            found.setdefault((layer, module), {})[which] = f.get_tensor(key)

    slices = _slices(shape, intermediate_size)
    parts: dict[tuple[int, str], list[tuple[int | None, torch.Tensor, torch.Tensor]]] = {}
    for (layer, module), ab in sorted(found.items()):
        if layer >= shape.num_layers:
            raise AdapterError(
                f"LoRA adapter {name!r} has layer {layer}; the base model has {shape.num_layers}"
            )
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"LoRA adapter {name!r}: layer {layer} {module} lacks lora_A or lora_B")
        linear, part = TARGETS[module]
        if layer in moe_layers and linear in ("gate_up", "down"):
            raise AdapterError(
                f"LoRA adapter {name!r} targets {module} of layer {layer}, whose experts take no adapter"
            )
        in_features, outs = slices[linear]
        out = sum(outs) if part is None else outs[part]
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or a.shape[0] > max_rank:
            raise AdapterError(
                f"LoRA adapter {name!r}: layer {layer} {module} has lora_A {tuple(a.shape)} "
                f"and lora_B {tuple(b.shape)}, not [r, in] and [out, r] with r <= {max_rank}"
            )
        if a.shape[1] != in_features or b.shape[0] != out:
            raise AdapterError(
                f"LoRA adapter {name!r} does not fit the base model: layer {layer} {module} maps "
                f"{a.shape[1]} -> {b.shape[0]} features, the base model's {in_features} -> {out}"
            )
        parts.setdefault((layer, linear), []).append((part, a, b))

    pairs = {}
    for (layer, linear), items in parts.items():
        outs = slices[linear][1]
        starts = [sum(outs[:k]) for k in range(len(outs))]
        total_rank = sum(a.shape[0] for _, a, _ in items)
        big_b = torch.zeros(sum(outs), total_rank, dtype=torch.float32)
        col = 0
        for part, a, b in items:
            r = a.shape[0]
            rows = slice(0, sum(outs)) if part is None else slice(starts[part], starts[part] + outs[part])
            big_b[rows, col : col + r] = b.to(torch.float32) * scaling
            col += r
        big_a = torch.cat([a.to(torch.float32) for _, a, _ in items], dim=0)
        pairs[(layer, linear)] = LoraPair(
            a=big_a.to(device=device, dtype=dtype).contiguous(),
            b=big_b.to(device=device, dtype=dtype).contiguous(),
        )
    if not pairs:
        raise AdapterError(f"LoRA adapter {name!r} holds no LoRA weights")
    return LoraAdapter(name=name, rank=rank, pairs=pairs)
