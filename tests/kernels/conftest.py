"""Kernel tests run on any machine: without a CUDA device triton's interpreter
executes the kernels on CPU tensors (slowly, so every shape here is tiny).

`TRITON_INTERPRET=1` is set here, at conftest import, and stays set for the rest of
the process. triton reads it when a kernel is jitted, which for these kernels is
their first launch (`runner/kernels/_jit.py`), so it takes effect even when
triton itself was imported earlier (transformers imports it through
torch._inductor); the kernels avoid the jitted `triton.language` helpers that
would not follow (see `runner/kernels/_paged_attention.py`).
"""

from __future__ import annotations

import os

import pytest


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


HAS_CUDA = _cuda_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"
