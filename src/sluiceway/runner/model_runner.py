"""`TorchModelRunner`: the engine's `ModelRunner` on torch (CPU or CUDA).

One `step` flattens the scheduled chunks into one token batch, runs the model
under `torch.inference_mode`, and samples the rows that asked for a token. The
runner keeps no per-sequence state besides the KV cache the block tables name.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence

import attrs
import torch

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch
from sluiceway.runner.attention import AttentionBackend, AttentionMetadata, TorchAttention
from sluiceway.runner.kv_cache import KVCache, kv_cache_bytes_per_block, num_blocks_for_budget
from sluiceway.runner.loading import LoadedModel
from sluiceway.runner.model import LlamaModel
from sluiceway.runner.sampler import sample

log = logging.getLogger(__name__)

AttentionFactory = Callable[[KVCache], AttentionBackend]


@attrs.frozen
class StepInputs:
    """One step's flattened model inputs, on the model's device."""

    input_ids: torch.Tensor  # int64 [T]
    positions: torch.Tensor  # int64 [T]
    logits_indices: torch.Tensor  # int64 [S], last row of each sampling chunk
    meta: AttentionMetadata


def build_inputs(
    chunks: Sequence[ScheduledChunk], block_size: int, scale: float, device
) -> StepInputs:
    """Flatten `chunks` into token ids, positions, slot mapping and attention metadata."""
    q_lens = [len(c.token_ids) for c in chunks]
    seq_lens = [c.start_pos + n for c, n in zip(chunks, q_lens, strict=True)]
    width = max(-(-s // block_size) for s in seq_lens)
    tables = [
        list(c.block_table[:width]) + [0] * (width - min(width, len(c.block_table))) for c in chunks
    ]
    ids = torch.tensor(
        list(itertools.chain.from_iterable(c.token_ids for c in chunks)), dtype=torch.int64
    )
    starts = torch.tensor([c.start_pos for c in chunks], dtype=torch.int64)
    q_lens_t = torch.tensor(q_lens, dtype=torch.int64)
    query_start_loc = torch.zeros(len(chunks) + 1, dtype=torch.int64)
    torch.cumsum(q_lens_t, 0, out=query_start_loc[1:])
    seq_index = torch.repeat_interleave(torch.arange(len(chunks)), q_lens_t)
    positions = torch.arange(len(ids)) - query_start_loc[seq_index] + starts[seq_index]
    block_tables = torch.tensor(tables, dtype=torch.int64)
    slots = block_tables[seq_index, positions // block_size] * block_size + positions % block_size
    sample_rows = [i for i, c in enumerate(chunks) if c.sample]
    logits_indices = query_start_loc[1:][sample_rows] - 1
    meta = AttentionMetadata(
        slot_mapping=slots.to(device),
        block_tables=block_tables.to(device=device, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=query_start_loc.to(device=device, dtype=torch.int32),
        scale=scale,
        query_lens_host=tuple(q_lens),
        seq_lens_host=tuple(seq_lens),
    )
    return StepInputs(
        input_ids=ids.to(device),
        positions=positions.to(device),
        logits_indices=logits_indices.to(device),
        meta=meta,
    )


class TorchModelRunner:
    """Implements `sluiceway.engine.batch.ModelRunner`.

    Give exactly one of `num_blocks` or `kv_cache_bytes` (a memory budget; the
    runner takes as many whole blocks as fit). `attention` builds the attention
    backend over the allocated cache (default `TorchAttention`). `quantization="int8"`
    stores the linear weights as weight-only int8 (faster at batch 1, slower at
    large batches, not exact; see `runner/linear.py`).
    """

    def __init__(
        self,
        hf_config,
        state_dict: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        attention: AttentionFactory | None = None,
        quantization: str | None = None,
    ) -> None:
        if (num_blocks is None) == (kv_cache_bytes is None):
            raise ValueError("give exactly one of num_blocks or kv_cache_bytes")
        self.device = torch.device(device)
        self.model = LlamaModel(
            hf_config, state_dict, dtype=dtype, device=self.device, quantization=quantization
        )
        shape = self.model.shape
        if kv_cache_bytes is not None:
            per_block = kv_cache_bytes_per_block(
                num_layers=shape.num_layers,
                block_size=block_size,
                num_kv_heads=shape.num_kv_heads,
                head_dim=shape.head_dim,
                dtype=dtype,
            )
            num_blocks = num_blocks_for_budget(kv_cache_bytes, per_block)
        assert num_blocks is not None
        self.kv_cache = KVCache.allocate(
            num_layers=shape.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=dtype,
            device=self.device,
        )
        factory: AttentionFactory = attention or TorchAttention
        self.attention: AttentionBackend = factory(self.kv_cache)
        log.info("KV cache: %d blocks of %d tokens on %s", num_blocks, block_size, self.device)

    @classmethod
    def from_loaded(
        cls,
        loaded: LoadedModel,
        *,
        device: torch.device | str = "cpu",
        block_size: int = 16,
        num_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        attention: AttentionFactory | None = None,
        quantization: str | None = None,
    ) -> TorchModelRunner:
        """Build from `load_model(...)`, in the loaded dtype."""
        return cls(
            loaded.hf_config,
            loaded.state_dict(),
            dtype=loaded.dtype,
            device=device,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_bytes=kv_cache_bytes,
            attention=attention,
            quantization=quantization,
        )

    @property
    def block_size(self) -> int:
        return self.kv_cache.block_size

    @property
    def num_blocks(self) -> int:
        return self.kv_cache.num_blocks

    def step(self, batch: StepBatch) -> list[SampledToken]:
        """Run one step; returns one `SampledToken` per chunk with `sample=True`, in order."""
        if not batch.chunks:
            return []
        sampling = [c for c in batch.chunks if c.sample]
        with torch.inference_mode():
            logits = self.forward_logits(batch)
            return sample(logits, sampling) if sampling else []

    def forward_logits(self, batch: StepBatch) -> torch.Tensor:
        """The float32 logits `step` would sample from (tests and debugging)."""
        with torch.inference_mode():
            inputs = build_inputs(
                batch.chunks, self.block_size, self.model.shape.scale, self.device
            )
            meta = self.attention.prepare(inputs.meta)
            return self.model.forward(
                inputs.input_ids, inputs.positions, self.attention, meta, inputs.logits_indices
            )
