"""Adapters on int8 and int4 weights: the delta is added apart from the weight, so
a quantized layer takes it as a dense one does; in a mixed step each row gets
its own adapter's delta and no other's."""

from __future__ import annotations

import pytest
import torch
from lora_models import peft_model, save_adapter

from family_models import tiny
from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.lora_modules import LoraModules
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner

PROMPT = [5, 17, 99, 3, 42, 8, 250, 11]


def chunk(seq: int, lora_id: int) -> ScheduledChunk:
    return ScheduledChunk(
        seq_id=seq,
        token_ids=PROMPT,
        start_pos=0,
        block_table=[2 * seq, 2 * seq + 1],
        sample=True,
        params=SamplingParams(temperature=0.0, lora_id=lora_id),
    )


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_each_row_of_a_quantized_mixed_step_gets_its_own_adapter(quantization, tmp_path):
    base = tiny("llama")
    modules = LoraModules.of({"a": str(save_adapter(peft_model("llama", seed=1), tmp_path / "a"))})
    runner = TorchModelRunner(
        base.config, base.state_dict(), block_size=4, num_blocks=8, quantization=quantization
    )
    runner.enable_lora(modules, max_loras=1, max_rank=8)
    alone = [
        runner.forward_logits(StepBatch(chunks=(chunk(0, lora_id),)))[0] for lora_id in (0, 1)
    ]
    mixed = runner.forward_logits(StepBatch(chunks=(chunk(0, 0), chunk(1, 1))))
    assert not torch.allclose(alone[0], alone[1], atol=1e-2)  # the adapter shows
    torch.testing.assert_close(mixed[0], alone[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(mixed[1], alone[1], rtol=1e-4, atol=1e-4)
