"""How a model splits over N tensor-parallel ranks (Megatron-style, as vLLM splits
it), and the one rank's slice of its weights. Each canonical weight's family-given
`Role` (`runner/models/weights.py`) says how it splits:

- q/k/v and gate/up are column-parallel: each rank holds whole attention heads
  and a contiguous slice of the MLP's intermediate features (of every expert's,
  in a mixture of experts; the router is replicated).
- o and down are row-parallel: each rank multiplies its slice of the input
  features, and the partial outputs are summed over ranks (all-reduce). Their
  biases stay on rank 0 only, so the sum adds them once.
- KV heads are split when N divides their number; when N is a multiple of it,
  each KV head is replicated on N / KVH ranks (the ranks whose query heads
  share it), as vLLM does.
- The embedding and the output head are split on the vocabulary into N equal
  slices of ceil(V / N) rows, the last padded with zero rows; a rank embeds only
  the ids in its slice (the rows are summed over ranks), and rank 0 gathers the
  slices of the logits.

Everything that cannot be split is refused here, before any process starts,
with a one-line `TensorParallelError`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import attrs
import torch

from sluiceway.runner.models.registry import family_for
from sluiceway.runner.models.weights import Role, WeightView, is_bias, role_of


class TensorParallelError(ValueError):
    """The model cannot be split this way, or a rank failed; the message is one line."""


@attrs.frozen
class ShardPlan:
    """Rank `rank` of `world_size`: which heads, features and vocabulary rows it holds."""

    rank: int
    world_size: int
    num_heads: int  # query heads of the whole model
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    expert_intermediate_size: int | None = None

    @classmethod
    def for_config(cls, config, world_size: int, rank: int = 0) -> ShardPlan:
        """The plan for `config` over `world_size` ranks; raises `TensorParallelError`
        when a head count or the MLP width does not split."""
        if world_size < 1 or not 0 <= rank < world_size:
            raise TensorParallelError(f"rank {rank} of a tensor-parallel size {world_size}")
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        intermediate = config.intermediate_size
        n = world_size
        if heads % n:
            raise TensorParallelError(
                f"tensor-parallel size {n} does not divide the model's {heads} attention heads"
            )
        if kv_heads % n and n % kv_heads:
            raise TensorParallelError(
                f"tensor-parallel size {n} neither divides nor is a multiple of the model's "
                f"{kv_heads} KV heads"
            )
        if intermediate % n:
            raise TensorParallelError(
                f"tensor-parallel size {n} does not divide the model's MLP width {intermediate}"
            )
        experts = family_for(config).architecture(config).experts
        expert_width = None if experts is None else experts.intermediate_size
        if expert_width is not None and expert_width % n:
            raise TensorParallelError(
                f"tensor-parallel size {n} does not divide the model's expert width {expert_width}"
            )
        return cls(
            rank=rank,
            world_size=n,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=intermediate,
            vocab_size=config.vocab_size,
            expert_intermediate_size=expert_width,
        )

    @property
    def local_heads(self) -> int:
        return self.num_heads // self.world_size

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.num_kv_heads // self.world_size)

    @property
    def first_kv_head(self) -> int:
        # Replicated: rank r's query heads all share KV head r * KVH // N.
        return self.rank * self.num_kv_heads // self.world_size

    @property
    def local_intermediate(self) -> int:
        return self.intermediate_size // self.world_size

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.vocab_size // self.world_size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def local_config(self, config):
        """A copy of `config` describing this rank's slice: the model code then runs
        it unchanged (head_dim pinned, since it is no longer hidden // heads)."""
        local = copy.deepcopy(config)
        local.num_attention_heads = self.local_heads
        local.num_key_value_heads = self.local_kv_heads
        local.intermediate_size = self.local_intermediate
        if self.expert_intermediate_size is not None:
            local.moe_intermediate_size = self.expert_intermediate_size // self.world_size
        local.head_dim = self.head_dim
        local.vocab_size = self.vocab_per_rank
        return local

    def shard(
        self,
        views: Mapping[str, WeightView],
        state_dict: Mapping[str, Any],
        *,
        row_absmax: bool = False,
    ) -> dict[str, torch.Tensor]:
        """This rank's slices of the canonical weights `views` of `state_dict`
        (copies, so the whole can be freed). A value of `state_dict` may be a tensor
        or anything indexed like one (`checkpoint.LazyWeight`: then only the slices
        are read). With `row_absmax`, each row-parallel weight also gets its whole
        rows' largest |weight| (`<name>.row_absmax`, see `models/weights.py`): int8
        scales its slice by them, as one device scales the whole rows; a rank then
        reads those weights whole, one at a time."""
        sliced = {name: self._slice(name, view, state_dict) for name, view in views.items()}
        if row_absmax:
            for name, view in views.items():
                if role_of(name) is Role.ROW_PARALLEL and not is_bias(name):
                    whole = view.read(state_dict)
                    key = f"{name.removesuffix('.weight')}.row_absmax"
                    sliced[key] = whole.abs().amax(dim=1).contiguous()
        return sliced

    def linear_slices(self, config) -> dict[str, tuple[int, int]]:
        """`(output, input features)` of this rank's slice of each kind of linear
        weight of `config`'s layers (as `Linear` gets them: q/k/v and gate/up
        fused), by a name for messages. Every rank's slices have these shapes."""
        hidden, d = config.hidden_size, self.head_dim
        shapes = {
            "q/k/v": ((self.local_heads + 2 * self.local_kv_heads) * d, hidden),
            "o": (hidden, self.local_heads * d),
        }
        arch = family_for(config).architecture(config)
        if not all(arch.is_moe(i) for i in range(arch.shape.num_layers)):
            shapes["gate/up"] = (2 * self.local_intermediate, hidden)
            shapes["down"] = (hidden, self.local_intermediate)
        if self.expert_intermediate_size is not None:
            width = self.expert_intermediate_size // self.world_size
            shapes["expert gate/up"] = (2 * width, hidden)
            shapes["expert down"] = (hidden, width)
        return shapes

    def _slice(self, name: str, view: WeightView, state_dict: Mapping[str, Any]) -> torch.Tensor:
        d, i = self.head_dim, self.local_intermediate
        if ".experts." in name and self.expert_intermediate_size is not None:
            i = self.expert_intermediate_size // self.world_size
        role = role_of(name)
        if role is Role.QUERY_ROWS:
            first = self.rank * self.local_heads * d
            return view.read(state_dict, rows=(first, first + self.local_heads * d)).clone()
        if role is Role.KV_ROWS:
            first = self.first_kv_head * d
            return view.read(state_dict, rows=(first, first + self.local_kv_heads * d)).clone()
        if role is Role.MLP_ROWS:
            return view.read(state_dict, rows=(self.rank * i, (self.rank + 1) * i)).clone()
        if role is Role.ROW_PARALLEL:
            if is_bias(name):  # summed over ranks: rank 0 adds it once
                whole = view.read(state_dict).clone()
                return whole if self.rank == 0 else torch.zeros_like(whole)
            proj = name.split(".")[-1] if ".experts." in name else name.split(".")[2]
            width = self.local_heads * d if proj == "o" else i
            first = self.rank * width
            return view.read(state_dict, cols=(first, first + width)).clone()
        if role is Role.VOCAB_ROWS:
            return self._vocab_rows(view, state_dict)
        return view.read(state_dict).clone()

    def _vocab_rows(self, view: WeightView, state_dict: Mapping[str, Any]) -> torch.Tensor:
        rows = view.read(state_dict, rows=(self.vocab_start, self.vocab_start + self.vocab_per_rank))
        padded = torch.zeros((self.vocab_per_rank, rows.shape[1]), dtype=rows.dtype)
        padded[: rows.shape[0]] = rows
        return padded
