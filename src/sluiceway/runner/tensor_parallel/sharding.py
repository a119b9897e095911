"""How a Llama-family checkpoint splits over N tensor-parallel ranks (Megatron-style,
as vLLM splits it), and the one rank's slice of its weights.

- q/k/v and gate/up are column-parallel: each rank holds whole attention heads
  and a contiguous slice of the MLP's intermediate features.
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
        return cls(
            rank=rank,
            world_size=n,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=intermediate,
            vocab_size=config.vocab_size,
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
        local.head_dim = self.head_dim
        local.vocab_size = self.vocab_per_rank
        return local

    def shard(self, state_dict: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        """This rank's slices of `state_dict` (copies, so the whole can be freed).
        A value may be a tensor or anything indexed like one that has its `shape`
        (`checkpoint.LazyWeight`: then only the slices are read)."""
        out: dict[str, torch.Tensor] = {}
        d = self.head_dim
        q_rows = slice(self.rank * self.local_heads * d, (self.rank + 1) * self.local_heads * d)
        kv_rows = slice(self.first_kv_head * d, (self.first_kv_head + self.local_kv_heads) * d)
        i = self.local_intermediate
        mlp_rows = slice(self.rank * i, (self.rank + 1) * i)
        for name, tensor in state_dict.items():
            out[name] = self._slice(name, tensor, q_rows, kv_rows, mlp_rows).clone()
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in state_dict:
                out[name] = self._vocab_rows(state_dict[name])
        return out

    def _slice(self, name: str, tensor: Any, q_rows: slice, kv_rows: slice, mlp_rows: slice) -> torch.Tensor:
        leaf = name.rsplit(".", 2)[-2:]  # e.g. ["q_proj", "weight"]
        proj, kind = (leaf[0], leaf[1]) if len(leaf) == 2 else ("", "")
        if proj == "q_proj":
            return tensor[q_rows]
        if proj in ("k_proj", "v_proj"):
            return tensor[kv_rows]
        if proj in ("gate_proj", "up_proj"):
            return tensor[mlp_rows]
        if proj == "o_proj":
            return tensor[:, q_rows] if kind == "weight" else self._rank0_bias(tensor)
        if proj == "down_proj":
            return tensor[:, mlp_rows] if kind == "weight" else self._rank0_bias(tensor)
        return tensor[:]  # norms (and the vocabulary weights, sliced by the caller)

    def _rank0_bias(self, bias: Any) -> torch.Tensor:
        whole = bias[:]
        return whole if self.rank == 0 else torch.zeros_like(whole)

    def _vocab_rows(self, weight: Any) -> torch.Tensor:
        rows = weight[self.vocab_start : self.vocab_start + self.vocab_per_rank]
        padded = torch.zeros((self.vocab_per_rank, weight.shape[1]), dtype=rows.dtype)
        padded[: rows.shape[0]] = rows
        return padded
