"""CUDA graphs for decode steps, one per batch-size bucket.

A decode step of n sequences (every chunk one token, every chunk sampling) runs at
the smallest bucket B >= n: its inputs are copied into static device buffers, rows
n .. B-1 are padding, bucket B's graph replays, and rows 0 .. n-1 of its logits
are the step's. Prefill and mixed steps, and decode steps larger than the largest
bucket, are not taken (`run` returns None) and the runner runs them eagerly.

Padding rows have slot -1, which the cache write skips, and context length 0, for
which attention computes nothing: they read and write no KV block at all, so no
block has to be reserved for them. Their outputs are uninitialised and dropped.
Everything in `DecoderModel.forward` other than attention works row by row, so a
padding row never changes a real one (a GEMM over B rows may still round a real
row differently in the last bit than one over n rows).

Without capture (any device other than CUDA; tests) `run` calls the same forward
on the same static buffers ("eager replay"), so CPU tests cover all of this but
the capture itself.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import attrs
import torch

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.runner.attention import AttentionBackend, AttentionMetadata
from sluiceway.runner.kernels.backend import TritonAttention
from sluiceway.runner.models.decoder import DecoderModel

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PAD_SLOT = -1  # the cache write skips negative slots


def graph_safe(attention: AttentionBackend) -> bool:
    """Whether `attention` can run inside a CUDA graph with padding rows: its decode
    path reads only device tensors (no host syncs, no per-step host plan), skips
    negative slots and computes nothing for sequences of length 0."""
    return isinstance(attention, TritonAttention)


def default_batch_sizes(limit: int) -> tuple[int, ...]:
    """`DEFAULT_BATCH_SIZES` below `limit`, plus `limit` itself when it is within the
    largest default: the engine never decodes more than `max_num_seqs` sequences
    together (and a decode batch of n sequences needs n distinct blocks), so larger
    graphs would only cost capture time and memory."""
    below = tuple(b for b in DEFAULT_BATCH_SIZES if b < limit)
    return below + ((limit,) if 1 <= limit <= DEFAULT_BATCH_SIZES[-1] else ())


def pick_bucket(batch_sizes: Sequence[int], n: int) -> int | None:
    """The smallest of the ascending `batch_sizes` that holds `n` rows, or None."""
    i = bisect.bisect_left(batch_sizes, n)
    return batch_sizes[i] if i < len(batch_sizes) else None


@attrs.frozen
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # float32 [B, vocab], rewritten by every replay


class DecodeGraphs:
    """Static decode buffers for `batch_sizes` (ascending) and, after `capture`, one
    CUDA graph per size. Block tables hold up to `max_blocks_per_seq` blocks; a
    step whose sequences need more is left to the eager path.

    `attention` must be `graph_safe`. The static metadata's host tuples describe
    the bucket's shape only: every row has one query, and `seq_lens_host` holds the
    buffers' capacity, an upper bound, since a graph cannot follow host values.
    """

    def __init__(
        self,
        model: DecoderModel,
        attention: AttentionBackend,
        *,
        batch_sizes: Sequence[int],
        max_blocks_per_seq: int,
    ) -> None:
        sizes = tuple(sorted(set(batch_sizes)))
        if not sizes or sizes[0] < 1:
            raise ValueError(f"batch sizes must be positive, got {tuple(batch_sizes)}")
        if not graph_safe(attention):
            raise ValueError(f"{type(attention).__name__} cannot run in a CUDA graph")
        self.model = model
        self.attention = attention
        self.batch_sizes = sizes
        self.block_size = attention.kv_cache.block_size
        self.max_blocks_per_seq = max_blocks_per_seq
        self._graphs: dict[int, _Captured] = {}
        device, rows = model.device, sizes[-1]
        # Rows: input ids, positions, slots; one tensor so one copy fills all three.
        self._tokens = torch.zeros((3, rows), dtype=torch.int64, device=device)
        self._seq_lens = torch.zeros(rows, dtype=torch.int32, device=device)
        self._block_tables = torch.zeros(
            (rows, max_blocks_per_seq), dtype=torch.int32, device=device
        )
        self._rows = torch.arange(rows, device=device)  # every row's logits
        query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        capacity = max_blocks_per_seq * self.block_size
        self._metas = {
            b: attention.prepare(
                AttentionMetadata(
                    slot_mapping=self._tokens[2, :b],
                    block_tables=self._block_tables[:b],
                    seq_lens=self._seq_lens[:b],
                    query_start_loc=query_start_loc[: b + 1],
                    scale=model.shape.scale,
                    query_lens_host=(1,) * b,
                    seq_lens_host=(capacity,) * b,
                )
            )
            for b in sizes
        }

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def run(self, chunks: Sequence[ScheduledChunk]) -> torch.Tensor | None:
        """Float32 logits `[len(chunks), vocab]` for a decode step, or None (nothing
        run) when the step is not one `DecodeGraphs` takes. The result is a view of a
        static buffer: valid until the next `run`."""
        n = len(chunks)
        bucket = pick_bucket(self.batch_sizes, n)
        if n == 0 or bucket is None or not all(len(c.token_ids) == 1 and c.sample for c in chunks):
            return None
        if max(c.start_pos for c in chunks) // self.block_size >= self.max_blocks_per_seq:
            return None
        self._load(chunks)
        with torch.inference_mode():
            captured = self._graphs.get(bucket)
            if captured is None:
                return self._forward(bucket)[:n]
            captured.graph.replay()
            return captured.logits[:n]

    def capture(self) -> None:
        """Capture one graph per batch size, largest first, in one shared memory pool.

        The buffers hold only padding meanwhile, so the warm-up runs (which compile
        the kernels and let the GEMM libraries choose before capture) write no KV."""
        device = self.model.device
        if device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {device}")
        self._load(())
        with torch.inference_mode():
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for b in self.batch_sizes:
                    self._forward(b)
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
            pool = None
            for b in reversed(self.batch_sizes):
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    logits = self._forward(b)
                pool = graph.pool()
                self._graphs[b] = _Captured(graph=graph, logits=logits)
        torch.cuda.synchronize(device)

    def _forward(self, bucket: int) -> torch.Tensor:
        ids, positions = self._tokens[0, :bucket], self._tokens[1, :bucket]
        meta = self._metas[bucket]
        return self.model.forward(ids, positions, self.attention, meta, self._rows[:bucket])

    def _load(self, chunks: Sequence[ScheduledChunk]) -> None:
        """Copy `chunks`' inputs into rows 0 .. n-1 and padding into all other rows.

        Block-table columns past a row's context are left stale: attention reads
        only the blocks its `seq_lens` entry covers."""
        bs, pad = self.block_size, self._rows.shape[0] - len(chunks)
        positions = [c.start_pos for c in chunks]
        tables = [c.block_table for c in chunks]
        slots = [t[p // bs] * bs + p % bs for t, p in zip(tables, positions, strict=True)]
        tokens = torch.tensor(
            [
                [c.token_ids[0] for c in chunks] + [0] * pad,
                positions + [0] * pad,
                slots + [PAD_SLOT] * pad,
            ],
            dtype=torch.int64,
        )
        seq_lens = torch.tensor([p + 1 for p in positions] + [0] * pad, dtype=torch.int32)
        # Host memory is pageable, so non-blocking copies stage it at once and the
        # host never waits for the device's queue here.
        self._tokens.copy_(tokens, non_blocking=True)
        self._seq_lens.copy_(seq_lens, non_blocking=True)
        if chunks:
            width = max(positions) // bs + 1
            rows = [list(t[:width]) + [0] * (width - len(t[:width])) for t in tables]
            host = torch.tensor(rows, dtype=torch.int32)
            self._block_tables[: len(chunks), :width].copy_(host, non_blocking=True)
