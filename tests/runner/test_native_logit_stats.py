"""The native argmax + logsumexp the sampler uses on the CPU, against torch."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from sluiceway.runner.native.logit_stats import argmax_logsumexp

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _torch_stats(logits: torch.Tensor) -> tuple[list[int], list[float]]:
    return logits.max(dim=-1).indices.tolist(), torch.logsumexp(logits, dim=-1).tolist()


@pytest.mark.parametrize(("rows", "vocab"), [(1, 1), (1, 49152), (5, 1000), (33, 257)])
def test_matches_torch(rows, vocab):
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(vocab)) * 8
    result = argmax_logsumexp(logits)
    assert result is not None
    indices, lse = result
    want_indices, want_lse = _torch_stats(logits)
    assert indices.tolist() == want_indices
    torch.testing.assert_close(lse, torch.tensor(want_lse), rtol=1e-6, atol=1e-5)


def test_edge_rows():
    """Ties take the first maximum (in a later chunk of the row too), masked entries
    count for nothing, and the non-finite rows follow torch."""
    vocab = 700
    logits = torch.zeros(6, vocab)
    logits[0, [300, 301, 650]] = 4.0  # tie past the first 256-entry chunk
    logits[1] = float("-inf")  # everything masked
    logits[1, 5] = 1.0
    logits[2] = float("-inf")
    logits[3, 400] = float("inf")
    logits[4, 10] = float("nan")
    logits[4, 20] = 9.0
    logits[5, 0] = 3.0  # ties with the last entry
    logits[5, -1] = 3.0
    indices, lse = argmax_logsumexp(logits) or (None, None)
    assert indices is not None and lse is not None
    assert indices.tolist() == [300, 5, 0, 400, 10, 0]
    assert lse[1].item() == pytest.approx(1.0)
    assert lse[2].item() == -math.inf
    assert lse[3].item() == math.inf
    assert math.isnan(lse[4].item())
    torch.testing.assert_close(lse[[0, 5]], torch.logsumexp(logits[[0, 5]], dim=-1))


def test_what_it_does_not_take():
    assert argmax_logsumexp(torch.zeros(2, 8, dtype=torch.bfloat16)) is None
    assert argmax_logsumexp(torch.zeros(8, 2).t()) is None  # not contiguous
    assert argmax_logsumexp(torch.zeros(2, 0)) is None
