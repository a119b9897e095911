"""A scripted model runner for server tests: deterministic tokens, optional gating and failure."""

from __future__ import annotations

import attrs

from server_helpers import StepGate, scripted_token
from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch
from sluiceway.engine.pooling import PooledHidden, PoolingSpec


@attrs.define
class ScriptedRunner(StepGate):
    """Next token = `vocab[(last token + position) % len(vocab)]`: a function of the
    sequence alone, so each prompt has its own deterministic answer, the same alone
    or in any batch. After `eos_after`
    generated tokens it emits `eos` (None: never).

    Gating: with `gated=True` every step waits for a permit (`allow(k)`, or `open()`
    for all). `fail_next = True` makes the next step raise. `release()` (teardown)
    unblocks everything for good. Steps run in the engine's worker thread.
    """

    vocab: tuple[int, ...]
    eos: int
    num_blocks: int = 512
    block_size: int = 16
    eos_after: int | None = None
    fail_next: bool = False
    steps: int = 0
    seqs_seen: dict[int, int] = attrs.field(factory=dict)  # seq id -> tokens sampled

    def next_token(self, chunk: ScheduledChunk) -> int:
        if self.eos_after is not None and self.seqs_seen[chunk.seq_id] > self.eos_after:
            return self.eos
        return scripted_token(self.vocab, chunk)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.wait_for_permit()
        self.steps += 1
        if self.fail_next:
            raise RuntimeError("scripted step failure")
        out = []
        for c in batch.chunks:
            if c.sample:
                self.seqs_seen[c.seq_id] = self.seqs_seen.get(c.seq_id, 0) + 1
                tok = self.next_token(c)
                top = tuple(
                    (t, -1.0 - i) for i, t in enumerate(self.vocab[: c.params.logprobs or 0])
                )
                out.append(SampledToken(c.seq_id, tok, -0.25, top))
        return out


@attrs.define
class PoolingRunner(ScriptedRunner):
    """A `ScriptedRunner` that also makes embeddings: a prompt's is
    (its last token id, its length, 0, 0), pooled "last"."""

    pooling: PoolingSpec = attrs.field(factory=lambda: PoolingSpec("last", 4))

    def step_pooled(self, batch: StepBatch) -> tuple[list[SampledToken], list[PooledHidden]]:
        samples = self.step(batch)
        pooled = [
            PooledHidden(
                c.seq_id, (float(c.token_ids[-1]), float(c.start_pos + len(c.token_ids)), 0.0, 0.0)
            )
            for c in batch.chunks
            if c.pooling is not None
        ]
        return samples, pooled
