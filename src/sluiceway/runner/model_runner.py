"""`TorchModelRunner`: the engine's `ModelRunner` on torch (CPU or CUDA).

One `step` flattens the scheduled chunks into one token batch, runs the model
under `torch.inference_mode`, and samples the rows that asked for a token. Decode
steps can instead replay CUDA graphs over static buffers (`decode_graphs.py`).
The runner keeps no per-sequence state besides the KV cache the block tables name.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Literal

import attrs
import torch

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.pooling import PooledHidden, PoolingSpec
from sluiceway.runner.attention import AttentionBackend, AttentionMetadata, TorchAttention
from sluiceway.runner.decode_graphs import DecodeGraphs, default_batch_sizes, graph_safe
from sluiceway.runner.kv_cache import (
    KVCache,
    kv_cache_bytes_per_block,
    kv_cache_format,
    num_blocks_for_budget,
)
from sluiceway.runner.loading import LoadedModel
from sluiceway.runner.lora.table import LoraTable
from sluiceway.runner.models.architecture import ModelShape
from sluiceway.runner.models.decoder import DecoderModel
from sluiceway.runner.models.layer import StoredQuantized
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
    # Non-blocking: the host tensors are pageable, so each copy is staged at once
    # and the host does not wait for the device's queue to drain (a blocking copy
    # to a GPU synchronises the stream).
    meta = AttentionMetadata(
        slot_mapping=slots.to(device, non_blocking=True),
        block_tables=block_tables.to(torch.int32).to(device, non_blocking=True),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device, non_blocking=True),
        query_start_loc=query_start_loc.to(torch.int32).to(device, non_blocking=True),
        scale=scale,
        query_lens_host=tuple(q_lens),
        seq_lens_host=tuple(seq_lens),
    )
    return StepInputs(
        input_ids=ids.to(device, non_blocking=True),
        positions=positions.to(device, non_blocking=True),
        logits_indices=logits_indices.to(device, non_blocking=True),
        meta=meta,
    )


def pooled_rows(
    model: DecoderModel, hidden: torch.Tensor, chunks: Sequence[ScheduledChunk]
) -> list[PooledHidden]:
    """What each chunk with `pooling` asks of the step's residual stream `hidden`
    (`[T, hidden]`, the chunks' rows in order): the sum of its final-normed rows
    ("mean") or its last one ("last"), in float32."""
    pooled = []
    end = 0
    for chunk in chunks:
        start, end = end, end + len(chunk.token_ids)
        if chunk.pooling is None:
            continue
        rows = hidden[start:end] if chunk.pooling == "mean" else hidden[end - 1 : end]
        total = model.final_normed(rows).to(torch.float32).sum(0)
        pooled.append(PooledHidden(chunk.seq_id, tuple(total.tolist())))
    return pooled


def allocate_kv_cache(
    shape: ModelShape,
    *,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    num_blocks: int | None,
    kv_cache_bytes: int | None,
    agree: Callable[[int], int] | None = None,
    kv_cache_dtype: str = "auto",
) -> KVCache:
    """The KV cache of a model of `shape` computing in `dtype`, stored as
    `kv_cache_dtype` says (`kv_cache.KVCacheDType`): `num_blocks` blocks when
    given, else as many as fit `kv_cache_bytes` (ValueError when neither is
    given, not one fits, or the dtype is unknown). `agree` may lower the count
    first (tensor-parallel ranks take the smallest of theirs)."""
    format = kv_cache_format(kv_cache_dtype, dtype)
    if num_blocks is None:
        if kv_cache_bytes is None:
            raise ValueError("give num_blocks or kv_cache_bytes")
        per_block = kv_cache_bytes_per_block(
            num_layers=shape.num_layers,
            block_size=block_size,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            format=format,
        )
        num_blocks = num_blocks_for_budget(kv_cache_bytes, per_block)
    return KVCache.allocate(
        num_layers=shape.num_layers,
        num_blocks=agree(num_blocks) if agree is not None else num_blocks,
        block_size=block_size,
        num_kv_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        dtype=dtype,
        device=device,
        format=format,
    )


class TorchModelRunner:
    """Implements `sluiceway.engine.batch.ModelRunner`.

    Give exactly one of `num_blocks` or `kv_cache_bytes` (a memory budget; the
    runner takes as many whole blocks as fit), stored as `kv_cache_dtype` says
    ("auto": the model's dtype; "int8" or "fp8": quantized rows, see
    `runner/kv_cache.py`). `attention` builds the attention
    backend over the allocated cache (default `TorchAttention`). `quantization`
    ("int8" or "int4") stores the linear weights weight-only quantized (faster for
    small batches on CPU, not exact; see `runner/linear.py`).

    `cuda_graphs` runs decode steps of up to `max(graph_batch_sizes)` sequences
    (default 1, 2, 4, .., 256, at most `num_blocks`) through `DecodeGraphs`: None
    (auto) turns it on for a CUDA device with a graph-safe attention backend
    (`TritonAttention`) and falls back to eager, with a warning, if capture fails;
    True insists (ValueError for another backend; on a CPU device the static
    buffers run without capture, which is what tests exercise); False never.

    It also serves embeddings (`PoolingModelRunner`), pooled as `pooling` says
    (default: the last token's hidden state, as for a causal LM; False: none).
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
        cuda_graphs: bool | None = None,
        graph_batch_sizes: Sequence[int] | None = None,
        pooling: PoolingSpec | Literal[False] | None = None,
        stored: StoredQuantized | None = None,
        dense_copies: bool = False,
        kv_cache_dtype: str = "auto",
    ) -> None:
        """`stored` and `dense_copies`: see `DecoderModel`."""
        if (num_blocks is None) == (kv_cache_bytes is None):
            raise ValueError("give exactly one of num_blocks or kv_cache_bytes")
        self.device = torch.device(device)
        self.model = DecoderModel.from_checkpoint(
            hf_config,
            state_dict,
            dtype=dtype,
            device=self.device,
            quantization=quantization,
            stored=stored,
            dense_copies=dense_copies,
        )
        self.kv_cache = allocate_kv_cache(
            self.model.shape,
            dtype=dtype,
            device=self.device,
            block_size=block_size,
            num_blocks=num_blocks,
            kv_cache_bytes=kv_cache_bytes,
            kv_cache_dtype=kv_cache_dtype,
        )
        num_blocks = self.kv_cache.num_blocks
        factory: AttentionFactory = attention or TorchAttention
        self.attention: AttentionBackend = factory(self.kv_cache)
        log.info(
            "KV cache: %d blocks of %d tokens in %s on %s",
            num_blocks,
            block_size,
            self.kv_cache.format.name,
            self.device,
        )
        self.decode_graphs = self._build_decode_graphs(cuda_graphs, graph_batch_sizes)
        # LoRA adapters (`enable_lora`); None: only the base model is served.
        self.lora: LoraTable | None = None
        self.pooling: PoolingSpec | None = (
            None
            if pooling is False
            else pooling or PoolingSpec("last", self.model.shape.hidden_size)
        )

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
        cuda_graphs: bool | None = None,
        graph_batch_sizes: Sequence[int] | None = None,
        stored: StoredQuantized | None = None,
        dense_copies: bool = False,
        kv_cache_dtype: str = "auto",
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
            cuda_graphs=cuda_graphs,
            graph_batch_sizes=graph_batch_sizes,
            stored=stored,
            dense_copies=dense_copies,
            kv_cache_dtype=kv_cache_dtype,
            # A loaded model whose pooling this server does not compute has none.
            pooling=loaded.pooling if loaded.pooling is not None else False,
        )

    def _build_decode_graphs(
        self, enabled: bool | None, batch_sizes: Sequence[int] | None
    ) -> DecodeGraphs | None:
        safe = graph_safe(self.attention)
        arch = self.model.architecture
        auto = enabled is None
        if auto:
            enabled = self.device.type == "cuda" and safe
            if enabled and not arch.graph_safe:
                log.info(
                    "%s: decoding without CUDA graphs: layers with sliding windows or "
                    "soft caps plan their masked attention on the host each step",
                    arch.model_type,
                )
                enabled = False
        if not enabled:
            return None
        if not safe:
            raise ValueError(
                "cuda_graphs needs a graph-safe attention backend (TritonAttention), "
                f"not {type(self.attention).__name__}"
            )
        if not arch.graph_safe:
            raise ValueError(
                f"cuda_graphs: {arch.model_type} has layers with sliding windows or soft caps, "
                "whose masked attention plans on the host each step"
            )
        graphs = DecodeGraphs(
            self.model,
            self.attention,
            # A decode batch of n sequences holds n distinct blocks at least.
            batch_sizes=tuple(b for b in batch_sizes if b <= self.num_blocks) or (1,)
            if batch_sizes
            else default_batch_sizes(self.num_blocks),
            # A sequence never holds more blocks than exist.
            max_blocks_per_seq=self.num_blocks,
        )
        if self.device.type != "cuda":
            return graphs
        start = time.perf_counter()
        try:
            graphs.capture()
        except Exception:
            if not auto:
                raise
            # A server should still start, only slower; the traceback says why.
            log.warning("CUDA graph capture failed; decoding eagerly", exc_info=True)
            return None
        log.info(
            "captured decode CUDA graphs for batch sizes %s in %.1f s",
            ", ".join(map(str, graphs.batch_sizes)),
            time.perf_counter() - start,
        )
        return graphs

    def enable_lora(self, modules: LoraModules, *, max_loras: int, max_rank: int) -> LoraTable:
        """Serve the adapters of `modules` (by the `lora_id` of each chunk), keeping
        at most `max_loras` loaded; each is read and checked now (AdapterError
        naming the first bad one). Steps with an adapter's rows run eagerly, never
        through a decode graph."""
        table = LoraTable(self.model, modules, max_loras=max_loras, max_rank=max_rank)
        table.check_all()
        modules.max_loras = max_loras
        self.lora = table
        return table

    @contextmanager
    def _adapters(self, batch: StepBatch) -> Iterator[bool]:
        """The model serving `batch`'s rows with their adapters while inside; yields
        whether any row has one."""
        rows = None if self.lora is None else self.lora.rows(batch.chunks, self.device)
        self.model.lora_rows = rows
        try:
            yield rows is not None
        finally:
            self.model.lora_rows = None

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
        with torch.inference_mode(), self._adapters(batch) as adapted:
            logits = self._logits(batch, graphs=not adapted)
            return sample(logits, sampling, batch.token_masks) if sampling else []

    def step_pooled(self, batch: StepBatch) -> tuple[list[SampledToken], list[PooledHidden]]:
        """`step`, plus the pooled hidden states of every chunk with `pooling` set:
        the sum of its final-normed rows ("mean") or its last one ("last"), in
        float32, in chunk order. Such steps never replay a decode graph: their
        chunks are prefills."""
        sampling = [c for c in batch.chunks if c.sample]
        with torch.inference_mode(), self._adapters(batch):
            inputs = build_inputs(batch.chunks, self.block_size, self.model.shape.scale, self.device)
            meta = self.attention.prepare(inputs.meta)
            model = self.model
            hidden = model.hidden_states(inputs.input_ids, inputs.positions, self.attention, meta)
            samples: list[SampledToken] = []
            if sampling:
                logits = model.logits(model.final_normed(hidden[inputs.logits_indices]))
                samples = sample(logits, sampling, batch.token_masks)
            return samples, pooled_rows(model, hidden, batch.chunks)

    def forward_logits(self, batch: StepBatch) -> torch.Tensor:
        """The float32 logits `step` would sample from, as a new tensor (tests and
        debugging)."""
        with torch.inference_mode(), self._adapters(batch) as adapted:
            return self._logits(batch, graphs=not adapted).clone()

    def _logits(self, batch: StepBatch, graphs: bool = True) -> torch.Tensor:
        """Logits of the sampling rows; may be a graph's output buffer, which the
        next step overwrites (only with `graphs`)."""
        if graphs and self.decode_graphs is not None:
            logits = self.decode_graphs.run(batch.chunks)
            if logits is not None:
                return logits
        inputs = build_inputs(batch.chunks, self.block_size, self.model.shape.scale, self.device)
        meta = self.attention.prepare(inputs.meta)
        return self.model.forward(
            inputs.input_ids, inputs.positions, self.attention, meta, inputs.logits_indices
        )
