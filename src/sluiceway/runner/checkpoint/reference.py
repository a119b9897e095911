"""A transformers model built from a checkpoint's weights as the runner reads
them: the reference that comparisons (tests, `bench/engine_bench.py`) run
beside the runner. Serving never builds one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def transformers_module(config: Any, weights: Mapping[str, Any], *, torch_dtype: torch.dtype) -> Any:
    """`AutoModelForCausalLM` of `config` in `torch_dtype` holding `weights` (tensors,
    or lazy checkpoint tensors, read whole here), in eval mode. Tied embeddings
    are tied as transformers ties them."""
    from transformers import AutoModelForCausalLM

    module = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    state = {}
    for name, tensor in weights.items():
        value = tensor if isinstance(tensor, torch.Tensor) else tensor[(slice(None),)].reshape(tensor.shape)
        state[name] = value.to(torch_dtype)
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {missing[:3]}, unexpected {unexpected[:3]}")
    module.tie_weights()
    return module.eval()
