"""Every registered family, greedy-exact to transformers: a tiny random model of
each is built from its transformers config in-process, and its greedy tokens
through the runner equal `generate`'s over 32 tokens, for prompts alone, batched
with each other through chunked prefill, and across preemption and prefix-cache
hits on an engine core."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from family_models import BASE, FAMILIES, tiny
from greedy_rounds import FewerBlocks, greedy_rounds
from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.models.architecture import UnsupportedModel
from sluiceway.runner.models.registry import SUPPORTED_MODEL_TYPES, check_supported, family_for

MAX_NEW = 32
PROMPTS = [[5, 17, 99, 3, 42, 8, 250, 11, 64, 7, 1, 2, 3], [200, 201], [9] * 21, [4, 8, 15, 16, 23, 42]]
@functools.cache
def expected(name: str) -> tuple[tuple[int, ...], ...]:
    model = tiny(name)
    out = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            gen = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                min_new_tokens=MAX_NEW,
                pad_token_id=0,
            )
        out.append(tuple(gen[0, len(prompt) :].tolist()))
    return tuple(out)


def runner(name: str, num_blocks: int = 96) -> TorchModelRunner:
    model = tiny(name)
    return TorchModelRunner(model.config, model.state_dict(), block_size=4, num_blocks=num_blocks)


def test_every_family_here_is_registered():
    assert {tiny(n).config.model_type for n in FAMILIES} == SUPPORTED_MODEL_TYPES


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_prompt_alone_matches_generate(name):
    want = expected(name)
    for prompt, tokens in zip(PROMPTS, want, strict=True):
        [run] = greedy_rounds(runner(name), [prompt], max_new=MAX_NEW, budget=512)
        assert tuple(run.tokens[0]) == tokens


@pytest.mark.parametrize("name", list(FAMILIES))
def test_batched_chunked_preempted_and_cached_match_generate(name):
    # 5 tokens a step: the 13- and 21-token prompts are prefilled in chunks; 24
    # blocks of 4 tokens cannot hold every sequence at once; round two hits the
    # prefix cache.
    runs = greedy_rounds(FewerBlocks(runner(name), 24), PROMPTS, max_new=MAX_NEW, budget=5, rounds=2)
    assert runs[0].preemptions > 0 and runs[1].cached[2] > 0
    for run in runs:
        assert tuple(map(tuple, run.tokens)) == expected(name)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_the_transformers_forward(name):
    # Every prefix of a 21-token prompt in one step, each its own sequence: the
    # full logits (not only their argmax) show soft caps, scales and windows.
    model = tiny(name)
    prompt = [(7 * i + 3) % 256 for i in range(21)]
    greedy = SamplingParams(temperature=0.0)
    chunks = tuple(
        ScheduledChunk(
            seq_id=i,
            token_ids=prompt[:i],
            start_pos=0,
            block_table=list(range(6 * i, 6 * i + 6)),
            sample=True,
            params=greedy,
        )
        for i in range(1, len(prompt) + 1)
    )
    got = runner(name, num_blocks=6 * 22).forward_logits(StepBatch(chunks=chunks))
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_model_type_no_family_serves_is_named():
    config = transformers.GPT2Config()
    with pytest.raises(UnsupportedModel, match="unsupported architecture 'gpt2' \\(config field model_type\\)"):
        family_for(config)


def test_an_unsupported_activation_is_named():
    config = transformers.LlamaConfig(**dict(BASE, hidden_act="relu"))
    with pytest.raises(UnsupportedModel, match="hidden_act 'relu'"):
        check_supported(config)


def test_an_unsupported_layer_type_is_named():
    config = transformers.Qwen3Config(**dict(BASE, layer_types=["full_attention", "linear_attention"]))
    with pytest.raises(UnsupportedModel, match="layer_types entry 'linear_attention'"):
        check_supported(config)


def test_sliding_windows_land_on_the_layers_transformers_gives_them():
    def windows(name):
        return family_for(tiny(name).config).architecture(tiny(name).config).layer_windows

    assert windows("mistral-window") == (8, 8)
    assert windows("qwen3-window") == (None, 8)  # from max_window_layers = 1
    assert windows("gemma2") == (8, None)  # sliding, full, ...
    assert windows("qwen2") == ()  # use_sliding_window is off


def test_the_model_flag_help_names_every_family():
    import argparse
    import re

    from sluiceway.flags import add_model_flags

    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    text = " ".join(parser.format_help().split())
    [listed] = re.findall(r"supported family \(([^;]+);", text)
    assert sorted(listed.split(", ")) == sorted(SUPPORTED_MODEL_TYPES)
