"""Fixtures for runner tests: tiny random Llama-family models and a hand-driven
greedy decoder that plays the engine's part (block tables, chunking, batching)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner
from tiny_models import TINY_LLAMA

GREEDY = SamplingParams(temperature=0.0, max_tokens=None)
TINY = dict(TINY_LLAMA, vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _finish(model: torch.nn.Module) -> torch.nn.Module:
    model.eval()
    # Never stop early on a random model's EOS: compare full lengths.
    model.generation_config.eos_token_id = None
    return model


def _randomise_biases(model: torch.nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


@pytest.fixture(scope="session")
def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return _finish(LlamaForCausalLM(LlamaConfig(**TINY, tie_word_embeddings=False)))


@pytest.fixture(scope="session")
def tiny_config() -> dict:
    return dict(TINY)


@pytest.fixture(scope="session")
def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(**TINY, tie_word_embeddings=False))
    _randomise_biases(model)
    return _finish(model)


def make_runner(
    hf_model,
    *,
    block_size: int = 4,
    num_blocks: int = 64,
    dtype: torch.dtype = torch.float32,
    quantization: str | None = None,
) -> TorchModelRunner:
    return TorchModelRunner(
        hf_model.config,
        hf_model.state_dict(),
        dtype=dtype,
        block_size=block_size,
        num_blocks=num_blocks,
        quantization=quantization,
    )


def hf_greedy(hf_model, prompt: Sequence[int], max_new: int) -> list[int]:
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new,
            min_new_tokens=max_new,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


class GreedyDriver:
    """Plays the engine: gives each sequence its own blocks (or the tables it is
    given), prefills in chunks of at most `chunk` tokens, then decodes all sequences
    together one token per step."""

    def __init__(self, runner: TorchModelRunner) -> None:
        self.runner = runner
        self.next_block = 1  # block 0 stays unused so padding never aliases real data

    def allocate(self, num_tokens: int) -> list[int]:
        n = -(-num_tokens // self.runner.block_size)
        table = list(range(self.next_block, self.next_block + n))
        self.next_block += n
        return table

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new: int,
        *,
        chunk: int | None = None,
        tables: Sequence[Sequence[int]] | None = None,
    ) -> list[list[int]]:
        tables = tables or [self.allocate(len(p) + max_new) for p in prompts]
        tokens = [list(p) for p in prompts]
        done = [0] * len(prompts)  # tokens already in the KV cache
        outputs: list[list[int]] = [[] for _ in prompts]
        while any(len(o) < max_new for o in outputs):
            chunks = []
            for i, toks in enumerate(tokens):
                if len(outputs[i]) >= max_new:
                    continue
                end = len(toks) if chunk is None else min(len(toks), done[i] + chunk)
                chunks.append(
                    ScheduledChunk(
                        seq_id=i,
                        token_ids=toks[done[i] : end],
                        start_pos=done[i],
                        block_table=tables[i],
                        sample=end == len(toks),
                        params=GREEDY,
                    )
                )
                done[i] = end
            for s in self.runner.step(StepBatch(chunks=tuple(chunks))):
                outputs[s.seq_id].append(s.token_id)
                tokens[s.seq_id].append(s.token_id)
        return outputs


@pytest.fixture
def driver_for():
    def build(hf_model, **kwargs) -> GreedyDriver:
        return GreedyDriver(make_runner(hf_model, **kwargs))

    return build


@pytest.fixture(scope="session")
def hf_greedy_fn():
    return hf_greedy


@pytest.fixture(scope="session")
def make_runner_fn():
    return make_runner


@pytest.fixture(scope="session")
def greedy_driver_cls():
    return GreedyDriver
