"""Triton kernels for the paged KV cache (`[num_blocks, block_size, KVH, D]` per layer).

Importing this package imports neither triton nor any kernel: names are resolved on
first access, and each kernel is jitted on its first launch. Without a GPU the
kernels run only under `TRITON_INTERPRET=1`, which must be set before triton is
first imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "write_kv_cache": "sluiceway.runner.kernels.cache_write",
    "paged_attention_decode": "sluiceway.runner.kernels.paged_decode",
    "paged_attention_prefill": "sluiceway.runner.kernels.paged_prefill",
    "TritonAttention": "sluiceway.runner.kernels.backend",
    "select_attention_backend": "sluiceway.runner.kernels.backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
