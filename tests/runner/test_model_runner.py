"""The runner's greedy output matches transformers on tiny random models, however
the work is split into steps, batched, or laid out in the KV cache."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams

PROMPTS = [
    [5, 17, 99, 4, 203, 76, 31],
    [250, 11],
    [3, 8, 13, 21, 34, 55, 89, 144, 233, 121, 98, 12, 7, 66, 18, 200, 41],
]
MAX_NEW = 8


@pytest.fixture(scope="module")
def expected(tiny_llama, hf_greedy_fn):
    return [hf_greedy_fn(tiny_llama, p, MAX_NEW) for p in PROMPTS]


def test_each_prompt_alone_matches_generate(tiny_llama, driver_for, expected):
    for prompt, want in zip(PROMPTS, expected, strict=True):
        assert driver_for(tiny_llama).generate([prompt], MAX_NEW) == [want]


def test_prompts_batched_together_match_generate(tiny_llama, driver_for, expected):
    assert driver_for(tiny_llama).generate(PROMPTS, MAX_NEW) == expected


def test_many_sequences_of_other_lengths_decoded_together_match_generate(
    tiny_llama, driver_for, hf_greedy_fn
):
    # Nine sequences of nine lengths share every decode step, so each step's
    # attention batch is padded to the longest and the length mask matters.
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in range(2, 20, 2)]
    want = [hf_greedy_fn(tiny_llama, p, MAX_NEW) for p in prompts]
    assert driver_for(tiny_llama, num_blocks=200).generate(prompts, MAX_NEW) == want


@pytest.mark.parametrize("chunk", [1, 3, 5])
def test_chunked_prefill_matches_generate(tiny_llama, driver_for, expected, chunk):
    assert driver_for(tiny_llama).generate(PROMPTS, MAX_NEW, chunk=chunk) == expected


def test_block_size_does_not_matter(tiny_llama, driver_for, expected):
    assert (
        driver_for(tiny_llama, block_size=1, num_blocks=200).generate(PROMPTS, MAX_NEW) == expected
    )
    assert driver_for(tiny_llama, block_size=16).generate(PROMPTS, MAX_NEW) == expected


def test_logits_close_to_hf_forward(tiny_llama, make_runner_fn):
    runner = make_runner_fn(tiny_llama, num_blocks=200)
    prompt = PROMPTS[2]
    chunks = [
        ScheduledChunk(
            seq_id=0,
            token_ids=prompt[:i],
            start_pos=0,
            block_table=list(range(10 * i, 10 * i + 5)),
            sample=True,
            params=SamplingParams(temperature=0.0),
        )
        for i in range(1, len(prompt) + 1)
    ]
    got = runner.forward_logits(StepBatch(chunks=tuple(chunks)))
    with torch.no_grad():
        want = tiny_llama(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_qwen2_with_qkv_bias_matches_generate(tiny_qwen2, driver_for, hf_greedy_fn):
    want = [hf_greedy_fn(tiny_qwen2, p, MAX_NEW) for p in PROMPTS]
    assert driver_for(tiny_qwen2).generate(PROMPTS, MAX_NEW, chunk=4) == want


ROPE_SCALINGS = {
    "llama3": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 128},
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
}


@pytest.mark.parametrize("rope_type", ["default", *ROPE_SCALINGS])
def test_rope_scaling_with_tied_embeddings_matches_generate(
    rope_type, tiny_config, driver_for, hf_greedy_fn
):
    rope = {"rope_type": rope_type, "rope_theta": 500000.0, **ROPE_SCALINGS.get(rope_type, {})}
    torch.manual_seed(2)
    model = LlamaForCausalLM(
        LlamaConfig(**tiny_config, tie_word_embeddings=True, rope_parameters=rope)
    ).eval()
    model.generation_config.eos_token_id = None
    long_prompt = [
        (7 * i + 3) % 250 + 3 for i in range(40)
    ]  # past original_max_position_embeddings
    prompts = [*PROMPTS, long_prompt]
    want = [hf_greedy_fn(model, p, MAX_NEW) for p in prompts]
    assert driver_for(model).generate(prompts, MAX_NEW, chunk=6) == want


def test_mistral_matches_generate(tiny_config, driver_for, hf_greedy_fn):
    torch.manual_seed(4)
    model = MistralForCausalLM(MistralConfig(**tiny_config, sliding_window=None)).eval()
    model.generation_config.eos_token_id = None
    want = [hf_greedy_fn(model, p, MAX_NEW) for p in PROMPTS]
    assert driver_for(model).generate(PROMPTS, MAX_NEW) == want


def test_shared_prefix_block_written_and_read_in_one_step(tiny_llama, make_runner_fn):
    """B reuses A's first block (prefix cache) while A is still writing it this step."""
    prefix = [9, 8, 7, 6]
    a, b = [*prefix, 40, 41, 42], [*prefix, 50, 51]
    greedy = SamplingParams(temperature=0.0)

    def run(table_a, table_b, b_start):
        runner = make_runner_fn(tiny_llama)
        chunks = (
            ScheduledChunk(
                seq_id=0, token_ids=a, start_pos=0, block_table=table_a, sample=True, params=greedy
            ),
            ScheduledChunk(
                seq_id=1,
                token_ids=b[b_start:],
                start_pos=b_start,
                block_table=table_b,
                sample=True,
                params=greedy,
            ),
        )
        return runner.forward_logits(StepBatch(chunks=chunks))

    unshared = run([1, 2], [3, 4], 0)
    shared = run([1, 2], [1, 5], len(prefix))
    torch.testing.assert_close(shared, unshared, rtol=1e-5, atol=1e-5)


def test_step_returns_samples_in_chunk_order_and_skips_unsampled(tiny_llama, make_runner_fn):
    runner = make_runner_fn(tiny_llama)
    greedy = SamplingParams(temperature=0.0)
    chunks = (
        ScheduledChunk(
            seq_id=7, token_ids=[1, 2, 3], start_pos=0, block_table=[1], sample=False, params=greedy
        ),
        ScheduledChunk(
            seq_id=3, token_ids=[4, 5], start_pos=0, block_table=[2], sample=True, params=greedy
        ),
        ScheduledChunk(
            seq_id=5, token_ids=[6], start_pos=0, block_table=[3], sample=True, params=greedy
        ),
    )
    out = runner.step(StepBatch(chunks=chunks))
    assert [s.seq_id for s in out] == [3, 5]
    assert runner.step(StepBatch(chunks=())) == []


def test_memory_budget_sets_num_blocks(tiny_llama):
    from sluiceway.runner.model_runner import TorchModelRunner

    # 2 (k, v) * 2 layers * 4 tokens * 2 kv heads * 16 dims * 4 bytes = 2048 bytes a block
    runner = TorchModelRunner(
        tiny_llama.config, tiny_llama.state_dict(), block_size=4, kv_cache_bytes=10 * 2048 + 100
    )
    assert runner.num_blocks == 10
    assert runner.kv_cache.key_caches[0].shape == (10, 4, 2, 16)
    with pytest.raises(ValueError):
        TorchModelRunner(
            tiny_llama.config, tiny_llama.state_dict(), block_size=4, kv_cache_bytes=100
        )
