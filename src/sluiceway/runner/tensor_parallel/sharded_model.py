"""One rank's slice of a model, and its slice of the KV cache.

`ShardedDecoderModel` is `DecoderModel` over the rank's weights (see `sharding.py`)
with the three seams that make the slices one model: the embedding and the
row-parallel projections are summed over ranks (all-reduce), and rank 0
gathers every rank's slice of the logits. The fused one-token C step is off: it
runs every layer in one call, with nowhere to reduce between them. Weight-only
quantization quantizes each slice with the one-device `Linear`, a row-parallel
int8 slice on its whole rows' scales (`tensor_parallel/quantization.py`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.engine.pooling import PooledHidden
from sluiceway.runner.attention import AttentionBackend, TorchAttention
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.model_runner import allocate_kv_cache, build_inputs, pooled_rows
from sluiceway.runner.models.decoder import DecoderModel
from sluiceway.runner.models.registry import family_for
from sluiceway.runner.tensor_parallel.sharding import ShardPlan


class ShardedDecoderModel(DecoderModel):
    """Rank `plan.rank`'s slice; every rank must run `forward` on the same inputs,
    in step (each call makes collectives on `group`). `forward` returns the whole
    vocabulary's logits on rank 0 and this rank's padded slice elsewhere."""

    def __init__(
        self,
        config,
        state_dict: Mapping[str, Any],
        plan: ShardPlan,
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        group: dist.ProcessGroup | None = None,
        quantization: str | None = None,
    ) -> None:
        # The views come from the whole model's config: where a fused checkpoint
        # tensor's parts begin depends on the whole head counts.
        views = family_for(config).weight_views(config, state_dict)
        super().__init__(
            plan.local_config(config),
            plan.shard(views, state_dict, row_absmax=quantization == "int8"),
            dtype=dtype,
            device=device,
            quantization=quantization,
        )
        self.plan = plan
        self.group = group
        self.fuse_one_token_steps = False
        # Seconds spent in collectives since last reset, waiting for slower ranks
        # included: what a step costs beyond its share of the arithmetic.
        self.collective_seconds = 0.0

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        local = input_ids - self.plan.vocab_start
        outside = (local < 0) | (local >= self.plan.vocab_per_rank)
        assert self.embed is not None, "a rank reads its slice as values, never stored blocks"
        rows = F.embedding(local.clamp(0, self.plan.vocab_per_rank - 1), self.embed)
        rows.masked_fill_(outside[:, None], 0)
        return self.reduce(rows)

    def output_logits(self, normed: torch.Tensor) -> torch.Tensor:
        local = self.lm_head(normed).to(torch.float32).contiguous()
        start = time.perf_counter()
        if self.plan.rank != 0:
            dist.gather(local, None, dst=0, group=self.group)
            self.collective_seconds += time.perf_counter() - start
            return local
        slices = [torch.empty_like(local) for _ in range(self.plan.world_size)]
        dist.gather(local, slices, dst=0, group=self.group)
        self.collective_seconds += time.perf_counter() - start
        return torch.cat(slices, dim=1)[:, : self.plan.vocab_size]

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        dist.all_reduce(partial, group=self.group)
        self.collective_seconds += time.perf_counter() - start
        return partial


class ShardRunner:
    """A rank's model, KV cache and attention backend: the tensor-parallel
    counterpart of `TorchModelRunner` without sampling (rank 0 samples) and
    without decode graphs. The KV cache holds `num_blocks` blocks when given,
    else as many as fit `kv_cache_bytes` on every rank (the smallest count is
    agreed over `cpu_group`, which must be a gloo group), stored as
    `kv_cache_dtype` says. `quantization` is the
    weight path of every rank's linear slices (None, "int8" or "int4"; CPU only)."""

    def __init__(
        self,
        hf_config,
        state_dict: Mapping[str, Any],
        plan: ShardPlan,
        *,
        dtype: torch.dtype,
        device: torch.device,
        block_size: int,
        num_blocks: int | None,
        kv_cache_bytes: int | None,
        kv_cache_dtype: str = "auto",
        attention: Callable[[KVCache], AttentionBackend] | None = None,
        group: dist.ProcessGroup | None = None,
        cpu_group: dist.ProcessGroup | None = None,
        quantization: str | None = None,
    ) -> None:
        self.device = device
        self.model = ShardedDecoderModel(
            hf_config,
            state_dict,
            plan,
            dtype=dtype,
            device=device,
            group=group,
            quantization=quantization,
        )

        def smallest_over_ranks(count: int) -> int:
            agreed = torch.tensor([count], dtype=torch.int64)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=cpu_group)
            return int(agreed.item())

        self.kv_cache = allocate_kv_cache(
            self.model.shape,
            dtype=dtype,
            device=device,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_bytes=kv_cache_bytes,
            agree=smallest_over_ranks,
            kv_cache_dtype=kv_cache_dtype,
        )
        self.attention: AttentionBackend = (attention or TorchAttention)(self.kv_cache)

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    def run(self, chunks: Sequence[ScheduledChunk]) -> tuple[torch.Tensor, list[PooledHidden]]:
        """Run one step's chunks (every rank the same ones, in step): the sampling
        rows' logits as `ShardedDecoderModel.forward` returns them, and the pooled
        hidden states of the chunks with `pooling` (the residual stream is whole
        on every rank)."""
        inputs = build_inputs(chunks, self.kv_cache.block_size, self.model.shape.scale, self.device)
        meta = self.attention.prepare(inputs.meta)
        model = self.model
        hidden = model.hidden_states(inputs.input_ids, inputs.positions, self.attention, meta)
        logits = model.logits(model.final_normed(hidden[inputs.logits_indices]))
        return logits, pooled_rows(model, hidden, chunks)
