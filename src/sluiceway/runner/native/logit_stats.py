"""`argmax_logsumexp`: each row's first maximum and logsumexp in C (see
`logit_stats.c`); the sampler needs both for every sampled row of every step."""

from __future__ import annotations

import ctypes

import torch

from sluiceway.runner.native.library import bind

_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]  # logits, rows, vocab
_ARGTYPES += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]  # indices, lse, num_threads


def _function():
    return bind("logit_stats", "argmax_logsumexp_f32", _ARGTYPES)


def argmax_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(indices int64 [S], logsumexp float32 [S])` for contiguous float32 CPU
    `logits [S, vocab]`, or None where the kernel does not apply or cannot be built
    (the caller then computes both in torch)."""
    if not (
        logits.dtype == torch.float32
        and logits.device.type == "cpu"
        and logits.dim() == 2
        and logits.is_contiguous()
        and logits.shape[1] > 0
    ):
        return None
    fn = _function()
    if fn is None:
        return None
    rows, vocab = logits.shape
    indices = torch.empty(rows, dtype=torch.int64)
    lse = torch.empty(rows, dtype=torch.float32)
    fn(logits.data_ptr(), rows, vocab, indices.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return indices, lse
