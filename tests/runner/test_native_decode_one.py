"""The one-token decode step in C (`OneTokenDecode`) against the Python layer loop
on the same kernels: the same logits bit for bit, int4 and int8, bfloat16 and
float32, with and without projection biases, and the steps it leaves to the loop."""

from __future__ import annotations

import shutil

import attrs
import pytest
import torch

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.native.decode_one import OneTokenDecode
from sluiceway.runner.native.quantized_matmul_f32 import quantized_matmul_f32_available
from sluiceway.runner.native.quantized_matvec import int4_matvec_available

from .conftest import GREEDY, make_runner

_NO_CC = shutil.which("cc") is None
needs_bf16_kernels = pytest.mark.skipif(
    _NO_CC or not int4_matvec_available(64),
    reason="needs a C compiler and a CPU with AVX512-BF16",
)
needs_f32_kernels = pytest.mark.skipif(
    _NO_CC or not quantized_matmul_f32_available(),
    reason="needs a C compiler and a CPU with AVX2 and FMA",
)
DTYPES = [
    pytest.param(torch.bfloat16, marks=needs_bf16_kernels, id="bf16"),
    pytest.param(torch.float32, marks=needs_f32_kernels, id="f32"),
]


def _runner(
    hf_model,
    *,
    fused: bool,
    quantization: str | None = "int4",
    dtype: torch.dtype = torch.bfloat16,
    kv_cache_dtype: str = "auto",
) -> TorchModelRunner:
    if kv_cache_dtype == "auto":
        runner = make_runner(hf_model, num_blocks=32, dtype=dtype, quantization=quantization)
    else:
        runner = TorchModelRunner(
            hf_model.config,
            hf_model.state_dict(),
            dtype=dtype,
            block_size=4,
            num_blocks=32,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
        )
    runner.model.fuse_one_token_steps = fused
    return runner


def _chunk(seq_id: int, tokens: list[int], start: int, table: list[int]) -> ScheduledChunk:
    return ScheduledChunk(
        seq_id=seq_id,
        token_ids=tokens[start:],
        start_pos=start,
        block_table=table,
        sample=True,
        params=GREEDY,
    )


def _decode_logits(runner: TorchModelRunner, prompt: list[int], steps: int, calls: list[int]):
    """Logits of a prefill and `steps` one-token steps of one sequence; counts the
    fused steps into `calls`."""
    fused = runner.model._one_token_decode

    def counting(attention, meta):
        found = fused(attention, meta)
        calls.append(found is not None)
        return found

    runner.model._one_token_decode = counting  # type: ignore[method-assign]
    tokens, table, out = list(prompt), [3, 9, 1, 14, 6, 20], []
    start = 0
    for _ in range(steps + 1):
        logits = runner.forward_logits(StepBatch(chunks=(_chunk(0, tokens, start, table),)))
        out.append(logits)
        start = len(tokens)
        tokens.append(int(logits[0].argmax()))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("quantization", ["int4", "int8"])
@pytest.mark.parametrize("model", ["tiny_llama", "tiny_qwen2"])  # qwen2: q/k/v biases
# The dtype's default kernels, and int8_dot's tiles for both dtypes.
@pytest.mark.parametrize("tiles", [None, True], ids=["default", "tiles"])
def test_fused_steps_give_the_python_loops_logits_bit_for_bit(
    model, quantization, dtype, tiles, request
):
    from sluiceway.runner import linear

    hf_model = request.getfixturevalue(model)
    prompt = [5, 17, 99, 4, 203, 76, 31]
    used: dict[bool, list[int]] = {False: [], True: []}
    linear.use_int8_activation_kernels(tiles)
    try:
        runners = {
            fused: _runner(hf_model, fused=fused, quantization=quantization, dtype=dtype)
            for fused in (False, True)
        }
    finally:
        linear.use_int8_activation_kernels(None)
    if tiles:
        assert all(
            getattr(layer.qkv.quantized, "tiled", None) for layer in runners[True].model.layers
        )
    logits = {
        fused: _decode_logits(runners[fused], prompt, 12, used[fused]) for fused in (False, True)
    }
    # The prefill runs the loop either way; every one-token step after it is fused.
    assert used[True] == [True] * 12 and not any(used[False])
    for python_loop, fused in zip(logits[False], logits[True], strict=True):
        assert torch.equal(python_loop, fused)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_cache_dtype", ["int8", "fp8"])
def test_fused_steps_over_a_quantized_cache_give_the_python_loops_logits(
    tiny_qwen2, dtype, kv_cache_dtype
):
    """An int8 or fp8 KV cache (`--kv-cache-dtype`): the C step quantizes this
    token's k and v into it and reads the codes back as the Python loop does, bit
    for bit, on int8_dot's tiles and the dtype's default kernels alike."""
    prompt = [5, 17, 99, 4, 203, 76, 31]
    used: dict[bool, list[int]] = {False: [], True: []}
    runners = {
        fused: _runner(
            tiny_qwen2, fused=fused, quantization="int8", dtype=dtype, kv_cache_dtype=kv_cache_dtype
        )
        for fused in (False, True)
    }
    assert runners[True].kv_cache.format.name == kv_cache_dtype
    logits = {
        fused: _decode_logits(runners[fused], prompt, 12, used[fused]) for fused in (False, True)
    }
    assert used[True] == [True] * 12 and not any(used[False])
    for python_loop, fused in zip(logits[False], logits[True], strict=True):
        assert torch.equal(python_loop, fused)
    # The codes really are read: the same model over a plain cache differs.
    plain = _decode_logits(
        _runner(tiny_qwen2, fused=True, quantization="int8", dtype=dtype), prompt, 12, []
    )
    assert not torch.equal(plain[-1], logits[True][-1])


@needs_bf16_kernels
def test_steps_of_several_tokens_or_sequences_keep_the_loop(tiny_llama, monkeypatch):
    calls = []
    original = OneTokenDecode.run

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(OneTokenDecode, "run", counting)
    runner = _runner(tiny_llama, fused=True)
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7], 0, [1, 2]),)))
    runner.forward_logits(StepBatch(chunks=(_chunk(1, [8, 9], 0, [3, 4]),)))
    two = StepBatch(chunks=(_chunk(0, [5, 6, 7, 10], 3, [1, 2]), _chunk(1, [8, 9, 11], 2, [3, 4])))
    runner.forward_logits(two)
    assert calls == []
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7, 10, 12], 4, [1, 2]),)))
    assert calls == [1]


@pytest.mark.parametrize("dtype", DTYPES)
def test_models_without_quantized_weights_have_no_fused_step(tiny_llama, dtype):
    runner = _runner(tiny_llama, fused=True, quantization=None, dtype=dtype)
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7], 0, [1, 2]),)))
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7, 8], 3, [1, 2]),)))
    assert runner.model._one_token is not None and runner.model._one_token[1] is None


@needs_bf16_kernels
@pytest.mark.parametrize("quantization", ["int4", "int8"])
def test_no_fused_step_where_the_matvec_kernels_are_missing(tiny_llama, quantization, monkeypatch):
    """A CPU without AVX512-BF16 (and without the integer dot products of
    int8_dot.c) builds the other kernels but not the quantized matrix-vector ones:
    the layer loop must serve its one-token steps."""
    from sluiceway.runner import linear
    from sluiceway.runner.native import decode_one

    monkeypatch.setattr(linear, "_tiles_wanted", lambda weight: False)
    monkeypatch.setattr(linear, "int4_matvec_available", lambda in_features: False)
    monkeypatch.setattr(decode_one, "int8_matvec_available", lambda in_features: False)
    runner = _runner(tiny_llama, fused=True, quantization=quantization)
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7], 0, [1, 2]),)))
    runner.forward_logits(StepBatch(chunks=(_chunk(0, [5, 6, 7, 8], 3, [1, 2]),)))
    assert runner.model._one_token is not None and runner.model._one_token[1] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_heads_the_kernels_do_not_take_keep_the_loop(tiny_llama, dtype):
    from sluiceway.runner.native.decode_one import _kernels_take

    runner = _runner(tiny_llama, fused=True, dtype=dtype)
    shape = runner.model.shape
    assert _kernels_take(shape)
    assert not _kernels_take(attrs.evolve(shape, head_dim=288))
    assert not _kernels_take(attrs.evolve(shape, num_heads=34, num_kv_heads=2))  # 17 per KV head
    assert not _kernels_take(attrs.evolve(shape, num_heads=6, num_kv_heads=4))
    wide = attrs.evolve(shape, head_dim=288)
    layers, cache = runner.model.layers, runner.kv_cache
    assert OneTokenDecode.build(wide, layers, cache, eligible=True) is None
    assert OneTokenDecode.build(shape, layers, cache, eligible=True) is not None
