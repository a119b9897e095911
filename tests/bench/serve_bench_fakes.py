"""A deterministic scripted runner for the serve-bench tests (no model, no torch)."""

from __future__ import annotations

import attrs

from sluiceway.engine.batch import SampledToken, StepBatch

# Ordinary one-token words of the SmolLM2 vocabulary (looked up in conftest).


@attrs.define
class CyclingRunner:
    """Next token = `vocab[(last token + position) % len(vocab)]`; never emits EOS
    unless asked, so `ignore_eos` + `max_tokens` decides every answer's length."""

    vocab: tuple[int, ...]
    num_blocks: int = 1024
    block_size: int = 16
    steps: int = 0

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.steps += 1
        out = []
        for c in batch.chunks:
            if c.sample:
                position = c.start_pos + len(c.token_ids)
                token = self.vocab[(c.token_ids[-1] + position) % len(self.vocab)]
                out.append(SampledToken(c.seq_id, token, -0.25, ()))
        return out
