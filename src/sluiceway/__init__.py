"""sluiceway: an OpenAI-compatible LLM inference server on trio.

`sluiceway.LLM` (offline generation) and `sluiceway.SamplingParams` are loaded
lazily, so `import sluiceway.client` stays free of torch and transformers.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from sluiceway.offline import LLM

        return LLM
    if name == "SamplingParams":
        from sluiceway.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(name)
