"""Sampling: seeded draws independent of batch company, filters, penalties, logprobs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.sampler import sample

VOCAB = 64


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _chunk(seq_id: int = 0, step_seed: int = 0, **kwargs) -> ScheduledChunk:
    extra = {
        k: kwargs.pop(k)
        for k in ("suppressed_token_ids", "prompt_token_ids", "output_token_ids")
        if k in kwargs
    }
    return ScheduledChunk(
        seq_id=seq_id,
        token_ids=[1],
        start_pos=0,
        block_table=[0],
        sample=True,
        params=SamplingParams(**kwargs),
        step_seed=step_seed,
        **extra,
    )


def test_seeded_row_draws_the_same_token_whatever_shares_the_batch():
    logits = _logits(6)
    target = _chunk(seq_id=0, step_seed=1234, temperature=0.9, top_p=0.9)
    alone = sample(logits[:1], [target])[0]
    others = [
        _chunk(seq_id=1, step_seed=7, temperature=1.3, top_k=5),
        _chunk(seq_id=2, temperature=0.0),
        _chunk(seq_id=3, step_seed=99, min_p=0.2, logprobs=3),
        _chunk(seq_id=4, step_seed=5, repetition_penalty=1.5, output_token_ids=[1, 2]),
    ]
    for position in range(len(others) + 1):
        batch = [*others[:position], target, *others[position:]]
        rows = torch.cat([logits[1 : position + 1], logits[:1], logits[position + 1 : 5]])
        got = sample(rows, batch)[position]
        assert got == alone


def test_different_seeds_explore_the_distribution():
    logits = torch.zeros(1, VOCAB)
    drawn = {sample(logits, [_chunk(step_seed=s)])[0].token_id for s in range(200)}
    assert len(drawn) > VOCAB // 2


def test_top_k_one_equals_greedy():
    logits = _logits(8, seed=1)
    greedy = sample(logits, [_chunk(seq_id=i, temperature=0.0) for i in range(8)])
    top1 = sample(
        logits, [_chunk(seq_id=i, step_seed=i, temperature=1.5, top_k=1) for i in range(8)]
    )
    assert [s.token_id for s in top1] == [s.token_id for s in greedy]
    assert [s.token_id for s in greedy] == logits.argmax(-1).tolist()


def test_tiny_top_p_and_full_min_p_equal_greedy():
    logits = _logits(4, seed=2)
    want = logits.argmax(-1).tolist()
    assert [
        s.token_id for s in sample(logits, [_chunk(step_seed=i, top_p=1e-6) for i in range(4)])
    ] == want
    assert [
        s.token_id for s in sample(logits, [_chunk(step_seed=i, min_p=1.0) for i in range(4)])
    ] == want


def test_top_k_restricts_draws_to_the_k_most_likely():
    logits = _logits(1, seed=3)
    allowed = set(logits[0].topk(3).indices.tolist())
    drawn = {
        sample(logits, [_chunk(step_seed=s, temperature=5.0, top_k=3)])[0].token_id
        for s in range(100)
    }
    assert drawn <= allowed
    assert len(drawn) > 1


def test_suppressed_ids_are_never_drawn():
    logits = torch.zeros(1, VOCAB)
    logits[0, 5] = 50.0  # overwhelmingly likely, but suppressed
    suppressed = (5, 6, 7)
    for s in range(50):
        (tok,) = sample(logits, [_chunk(step_seed=s, suppressed_token_ids=suppressed)])
        assert tok.token_id not in suppressed
    (greedy,) = sample(logits, [_chunk(temperature=0.0, suppressed_token_ids=suppressed)])
    assert greedy.token_id not in suppressed


def test_logit_bias_steers_greedy():
    logits = torch.zeros(1, VOCAB)
    logits[0, 3] = 1.0
    (tok,) = sample(logits, [_chunk(temperature=0.0, logit_bias={9: 2.0})])
    assert tok.token_id == 9


def test_repetition_penalty_follows_hf_semantics():
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.1] + [-5.0] * (VOCAB - 4)])
    # token 0 seen: 2.0 / 1.5 < 1.9, so greedy moves to token 1
    (tok,) = sample(logits, [_chunk(temperature=0.0, repetition_penalty=1.5, prompt_token_ids=[0])])
    assert tok.token_id == 1
    # a negative logit is multiplied: -1.0 * 1.5 < -1.1 (checked via the token left on top)
    logits2 = torch.tensor([[-1.0, -1.1] + [-5.0] * (VOCAB - 2)])
    (tok,) = sample(
        logits2, [_chunk(temperature=0.0, repetition_penalty=1.5, output_token_ids=[0])]
    )
    assert tok.token_id == 1


def test_presence_and_frequency_penalties_use_output_counts():
    logits = torch.tensor([[3.0, 2.5, 2.2] + [0.0] * (VOCAB - 3)])
    # presence 1.0 lowers token 0 to 2.0 once, whatever the count
    (tok,) = sample(
        logits, [_chunk(temperature=0.0, presence_penalty=1.0, output_token_ids=[0, 0, 0])]
    )
    assert tok.token_id == 1
    # frequency 0.2 * 3 occurrences lowers token 0 to 2.4 < 2.5
    (tok,) = sample(
        logits, [_chunk(temperature=0.0, frequency_penalty=0.2, output_token_ids=[0, 0, 0])]
    )
    assert tok.token_id == 1
    # prompt tokens do not count for OpenAI penalties
    (tok,) = sample(logits, [_chunk(temperature=0.0, presence_penalty=2.0, prompt_token_ids=[0])])
    assert tok.token_id == 0


def test_logprobs_come_from_raw_logits():
    logits = _logits(3, seed=4)
    chunks = [
        _chunk(seq_id=0, temperature=0.0, logprobs=5, repetition_penalty=2.0, output_token_ids=[0]),
        _chunk(seq_id=1, step_seed=3, temperature=0.5, logprobs=0),
        _chunk(seq_id=2, step_seed=3, temperature=2.0),
    ]
    out = sample(logits, chunks)
    raw = torch.log_softmax(logits, dim=-1)
    for row, token in enumerate(out):
        assert token.logprob == pytest.approx(raw[row, token.token_id].item(), abs=1e-5)
    values, ids = raw[0].topk(5)
    assert [t for t, _ in out[0].top_logprobs] == ids.tolist()
    assert [v for _, v in out[0].top_logprobs] == pytest.approx(values.tolist(), abs=1e-5)
    assert out[1].top_logprobs == ()
    assert out[2].top_logprobs == ()


def test_sample_does_not_modify_logits():
    logits = _logits(2, seed=5)
    before = logits.clone()
    sample(
        logits,
        [_chunk(temperature=0.0, logit_bias={1: 5.0}), _chunk(seq_id=1, step_seed=1, top_k=3)],
    )
    assert torch.equal(logits, before)


class _Masks:
    """TokenMasks already filled: `allowed[i]` are the tokens row `rows[i]` may take."""

    def __init__(self, rows: list[int], allowed: list[set[int]], vocab: int) -> None:
        words = (vocab + 31) // 32
        bits = np.zeros((len(rows), words), dtype=np.uint32)
        for i, tokens in enumerate(allowed):
            for t in tokens:
                bits[i, t // 32] |= np.uint32(1 << (t % 32))
        self.rows = tuple(rows)
        self._bits = bits.view(np.int32)
        self.fill_seconds = self.wait_seconds = 0.0

    def wait(self) -> Any:
        return self._bits


@pytest.mark.parametrize("model_vocab", [80, 96, 100])  # mask wider, as wide, narrower
def test_token_masks_leave_only_allowed_tokens(model_vocab: int) -> None:
    allowed = [{0, 31}, {32, 63, 70}]  # bit 0 and the sign bit 31 of a word
    masks = _Masks([0, 2], allowed, vocab=96 if model_vocab != 80 else 80)
    logits = torch.arange(model_vocab, dtype=torch.float32).repeat(3, 1)  # the last id wins
    chunks = [
        ScheduledChunk(i, [1], 0, [0], True, SamplingParams(temperature=t, seed=i), step_seed=i)
        for i, t in enumerate([0.0, 0.0, 1.0])
    ]
    out = sample(logits, chunks, masks)
    assert out[0].token_id == 31  # greedy: the best allowed token
    assert out[1].token_id == model_vocab - 1  # not masked
    assert out[2].token_id in allowed[1]  # sampled: an allowed token
    assert logits[0, -1] == model_vocab - 1  # the caller's logits are not modified
