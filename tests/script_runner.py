"""A model runner that writes given texts, for server tests where what the model
says matters and its weights do not: sequence k of the server writes
`texts[k % len(texts)]`, token by token as the tokenizer splits it (a tag such as
`</think>` comes in several tokens), then EOS.

Where a step's grammar mask forbids the text's next token, it takes the best
allowed token over fixed logits that favour closing JSON values, sampled by the
real sampler: a constrained choice's output went through the engine's masks.
With `gated=True` each step waits for a permit (`StepGate`)."""

from __future__ import annotations

from typing import Any

import attrs
import torch

from server_helpers import StepGate
from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.runner.sampler import sample


@attrs.define
class ScriptRunner(StepGate):
    scripts: list[list[int]]
    logits: torch.Tensor
    num_blocks: int = 512
    block_size: int = 16
    written: dict[int, int] = attrs.field(factory=dict)

    @classmethod
    def of(cls, tokenizer: Any, texts: list[str], **kwargs: Any) -> ScriptRunner:
        eos = tokenizer.eos_token_id
        scripts = [[*tokenizer.encode(t, add_special_tokens=False), eos] for t in texts]
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        logits = torch.tensor([5.0 if p[:1] in '"}],' else 0.0 for p in pieces])
        logits[eos] = 5.0
        return cls(scripts, logits, **kwargs)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        self.wait_for_permit()
        rows = [c for c in batch.chunks if c.sample]
        if not rows:
            return []
        logits = self.logits.expand(len(rows), -1).clone()
        for r, chunk in enumerate(rows):
            script = self.scripts[chunk.seq_id % len(self.scripts)]
            k = self.written.get(chunk.seq_id, 0)
            logits[r, script[min(k, len(script) - 1)]] += 100.0
            self.written[chunk.seq_id] = k + 1
        return sample(logits, rows, batch.token_masks)
