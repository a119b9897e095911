"""A scripted model runner for server tests: deterministic tokens, optional gating and failure."""

from __future__ import annotations

import threading

import attrs

from sluiceway.engine.batch import SampledToken, ScheduledChunk, StepBatch


@attrs.define
class ScriptedRunner:
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
    gated: bool = False
    fail_next: bool = False
    steps: int = 0
    seqs_seen: dict[int, int] = attrs.field(factory=dict)  # seq id -> tokens sampled
    _permits: threading.Semaphore = attrs.field(factory=lambda: threading.Semaphore(0))
    _open: threading.Event = attrs.field(factory=threading.Event)

    def allow(self, steps: int = 1) -> None:
        self._permits.release(steps)

    def open(self) -> None:
        self._open.set()
        self._permits.release(1_000_000)

    release = open

    def next_token(self, chunk: ScheduledChunk) -> int:
        position = chunk.start_pos + len(chunk.token_ids)
        if self.eos_after is not None and self.seqs_seen[chunk.seq_id] > self.eos_after:
            return self.eos
        return self.vocab[(chunk.token_ids[-1] + position) % len(self.vocab)]

    def step(self, batch: StepBatch) -> list[SampledToken]:
        if self.gated and not self._open.is_set():
            self._permits.acquire()
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
