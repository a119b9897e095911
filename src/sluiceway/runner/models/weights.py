"""A model's weights under one naming, whatever its checkpoint calls them.

A family maps each canonical weight to where its checkpoint keeps it
(`WeightView`): a tensor by name, one expert of a 3D expert tensor, or a range
of rows of a fused tensor (Phi-3's qkv_proj). The decoder, the tensor-parallel
sharding and the tests then speak only the canonical names:

    embed, final_norm, lm_head (absent when tied to embed)
    layers.{i}.input_norm, layers.{i}.post_attention_norm
    layers.{i}.{q,k,v,o}.weight|bias, layers.{i}.{q,k}_norm
    layers.{i}.{gate,up,down}.weight|bias                    (dense MLP)
    layers.{i}.router, layers.{i}.experts.{e}.{gate,up,down}  (experts)

A tensor-parallel rank's int8 slices add `layers.{i}.{o,down}.row_absmax` and
`layers.{i}.experts.{e}.down.row_absmax`: each whole row's largest |weight| of
a row-parallel weight, of which the rank holds some columns
(`linear.Int8Weight.quantize`).

Each canonical weight has one `Role`, which is how tensor parallelism splits it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch


class Role(enum.Enum):
    """How a weight is split over tensor-parallel ranks (`tensor_parallel.sharding`)."""

    QUERY_ROWS = "query heads' rows"
    KV_ROWS = "KV heads' rows"
    MLP_ROWS = "MLP features' rows"  # gate and up, of a dense MLP or of each expert
    ROW_PARALLEL = "input columns, partial outputs summed"  # o and down
    VOCAB_ROWS = "vocabulary rows"  # embed, lm_head
    REPLICATED = "whole on every rank"  # norms, the router


_LAYER_ROLES = {
    "q": Role.QUERY_ROWS,
    "k": Role.KV_ROWS,
    "v": Role.KV_ROWS,
    "gate": Role.MLP_ROWS,
    "up": Role.MLP_ROWS,
    "o": Role.ROW_PARALLEL,
    "down": Role.ROW_PARALLEL,
}


def role_of(name: str) -> Role:
    """The role of canonical weight `name` (see the module docstring)."""
    if name in ("embed", "lm_head"):
        return Role.VOCAB_ROWS
    parts = name.split(".")
    if parts[0] != "layers":
        return Role.REPLICATED  # final_norm
    # layers.{i}.{proj}.weight|bias or layers.{i}.experts.{e}.{proj}
    proj = parts[4] if parts[2] == "experts" else parts[2]
    return _LAYER_ROLES.get(proj, Role.REPLICATED)


def is_bias(name: str) -> bool:
    return name.endswith(".bias")


@attrs.frozen
class WeightView:
    """Where a canonical weight lives in a checkpoint: tensor `name`, its entry
    `expert` along the first dimension (a 3D expert tensor), and within that only
    rows `rows` (a fused tensor's part), half-open."""

    name: str
    expert: int | None = None
    rows: tuple[int, int] | None = None

    def read(
        self,
        state_dict: Mapping[str, Any],
        rows: tuple[int, int] | None = None,
        cols: tuple[int, int] | None = None,
    ) -> torch.Tensor:
        """The weight, or its rows `rows` and columns `cols` (relative to the view).
        `state_dict` values may be tensors or anything indexed like one
        (`tensor_parallel.checkpoint.LazyWeight`: then only what is indexed is read)."""
        start = self.rows[0] if self.rows is not None else 0
        if rows is not None:
            row_index = slice(start + rows[0], start + rows[1])
        elif self.rows is not None:
            row_index = slice(*self.rows)
        else:
            row_index = slice(None)
        index: tuple[Any, ...] = (row_index,)
        if cols is not None:
            index += (slice(*cols),)
        if self.expert is not None:
            index = (self.expert, *index)
        return state_dict[self.name][index]


class CanonicalWeights(Mapping[str, torch.Tensor]):
    """Canonical weights read from a checkpoint where asked for, each time it is
    asked: the decoder takes each once, so a checkpoint whose tensors are read
    lazily (`runner/checkpoint/`) is read one weight at a time, never held whole
    beside the runner's own layout. Membership and iteration read nothing."""

    def __init__(self, views: Mapping[str, WeightView], state_dict: Mapping[str, Any]) -> None:
        self._views, self._state_dict = views, state_dict

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._views[name].read(self._state_dict)

    def __contains__(self, name: object) -> bool:
        return name in self._views

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)

    def stored_type(self, name: str) -> str | None:
        """The GGML type the checkpoint stores canonical weight `name` as (its
        tensor's `type_name`: "Q6_K", "F16", ...), None where it does not say (a
        safetensors checkpoint, a tensor given as values)."""
        view = self._views.get(name)
        return None if view is None else getattr(self._state_dict[view.name], "type_name", None)


def read_all(
    views: Mapping[str, WeightView], state_dict: Mapping[str, Any]
) -> CanonicalWeights:
    """Every canonical weight, each read whole when it is looked up."""
    return CanonicalWeights(views, state_dict)


def plain_views(prefix_map: Mapping[str, str], state_dict: Mapping[str, Any]) -> dict[str, WeightView]:
    """Views of the checkpoint tensors named in `prefix_map` (canonical name ->
    checkpoint name) that the checkpoint has."""
    return {canon: WeightView(name) for canon, name in prefix_map.items() if name in state_dict}
