"""The model runner: the only torch code.

Other packages use the modules in `__all__` and nothing else of it
(`tests/test_import_layering.py` holds them to it): `loading` (a model's config,
tokenizer and weights), `checkpoint` (weights read a tensor at a time),
`model_runner` (the engine's `ModelRunner`), `quantization_choice`,
`decode_graphs`, `kernels` (the attention backend), `tensor_parallel`,
`openmp_teams`, `threads` (how many the model's work runs on) and `lora`
(LoRA adapters: their errors). Layers, attention, the KV cache, the sampler, native kernels and
model families are its own. Import the modules directly: this package imports
nothing itself, so that importing it stays cheap.
"""

__all__ = [
    "checkpoint",
    "decode_graphs",
    "kernels",
    "loading",
    "lora",
    "model_runner",
    "openmp_teams",
    "quantization_choice",
    "tensor_parallel",
    "threads",
]
