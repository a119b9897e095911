"""A model runner for grammar tests, where the model is not the point: fixed logits
that favour the characters that close JSON values, sampled by the real sampler, so
a step's token masks are applied exactly as the torch runner applies them."""

from __future__ import annotations

from typing import Any

import torch

from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.runner.sampler import sample

# Tokens that begin with a closing character win often enough that strings, arrays and objects end within
# tens of tokens; every other allowed token stays possible.
_CLOSERS = '"}],'
_BIAS = 5.0


class MaskFollowingRunner:
    def __init__(self, tokenizer: Any, *, num_blocks: int = 512, block_size: int = 16) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self._logits = torch.tensor(
            [_BIAS if piece[:1] in _CLOSERS else 0.0 for piece in pieces]
        )
        self._logits[tokenizer.eos_token_id] = _BIAS
        self.steps = 0

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.steps += 1
        rows = [c for c in batch.chunks if c.sample]
        if not rows:
            return []
        logits = self._logits.expand(len(rows), -1).clone()
        return sample(logits, rows, batch.token_masks)
