"""The CPU fast paths: prepacked half-precision linears, weight-only int8 and int4, batched
prefill of prompts without a cached prefix, and the half-precision RMSNorm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.linear import Linear, default_quantized_max_rows
from sluiceway.runner.model_runner import TorchModelRunner

GREEDY = SamplingParams(temperature=0.0)


def _chunk(seq_id, tokens, start, table, sample=True) -> ScheduledChunk:
    return ScheduledChunk(
        seq_id=seq_id,
        token_ids=tokens,
        start_pos=start,
        block_table=table,
        sample=sample,
        params=GREEDY,
    )


def _runner(hf_model, dtype=torch.float32, **kwargs) -> TorchModelRunner:
    return TorchModelRunner(
        hf_model.config, hf_model.state_dict(), dtype=dtype, block_size=4, num_blocks=64, **kwargs
    )


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5, 33, 200])
@pytest.mark.parametrize(("out_features", "in_features"), [(96, 64), (960, 576)])
def test_packed_bfloat16_linear_equals_f_linear(bias, rows, out_features, in_features):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=gen).to(torch.bfloat16)
    b = torch.randn(out_features, generator=gen).to(torch.bfloat16) if bias else None
    x = torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
    layer = Linear(weight, b)
    if torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert layer.kind == "mkldnn"
    else:  # no bfloat16 in oneDNN on this CPU (no AVX512-BF16/AMX): torch's own linear
        assert layer.kind == "plain"
    assert torch.equal(layer(x), F.linear(x, weight, b))


def test_float32_linear_stays_plain_f_linear():
    weight = torch.randn(8, 4)
    layer = Linear(weight)
    assert layer.kind == "plain" and layer.weight is weight


@pytest.mark.parametrize(("quantization", "tolerance"), [("int8", 0.02), ("int4", 0.12)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 9, 40])
@pytest.mark.parametrize("dense_copy", [True, False], ids=["dense-copy", "quantized-only"])
def test_quantized_linear_is_close(dtype, quantization, tolerance, rows, dense_copy):
    """Both paths (quantized kernel up to `quantized_max_rows`, dense beyond; the
    kernel for every row count without a dense copy) stay within the
    quantization's error of the original weight, also with an all-zero row and a
    constant group (a zero scale would make them 0/0)."""
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(128, 64, generator=gen)
    weight[3] = 0.0
    weight[5, :32] = 0.25
    bias = torch.randn(128, generator=gen)
    x = torch.randn(rows, 64, generator=gen)
    layer = Linear(
        weight.to(dtype), bias.to(dtype), quantization=quantization, dense_copy=dense_copy
    )
    assert layer.quantized is not None
    if layer.weight is not None:
        assert layer.quantized_max_rows == default_quantized_max_rows(dtype)
    else:
        assert not dense_copy and layer.quantized.serves_every_row_count()
    got = layer(x.to(dtype)).float()
    want = F.linear(x, weight, bias)
    assert (got - want).norm() / want.norm() < tolerance


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_quantized_and_dense_paths_compute_the_same_weights(quantization):
    """The dense copy holds exactly the dequantized values, so in float32 a batch's
    rows come out the same whichever path the batch size picks."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=gen)
    x = torch.randn(5, 64, generator=gen)
    quantized_path = Linear(weight, quantization=quantization)
    dense_path = Linear(weight, quantization=quantization, quantized_max_rows=0, dense_copy=True)
    torch.testing.assert_close(quantized_path(x), dense_path(x), rtol=1e-5, atol=1e-5)
    # and the values really are quantized: not the original weight
    assert not torch.allclose(dense_path(x), F.linear(x, weight), rtol=1e-3, atol=1e-3)


def test_int4_levels_per_group():
    """Each group of 32 inputs takes at most 16 distinct values, and its extremes
    are represented within half a step."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(16, 64, generator=gen)
    dense = Linear(weight, quantization="int4", quantized_max_rows=0, dense_copy=True).weight
    for group in dense.reshape(-1, 32):
        assert len(torch.unique(group)) <= 16
    step = (weight.reshape(-1, 32).amax(1) - weight.reshape(-1, 32).amin(1)) / 15
    error = (dense - weight).abs().reshape(-1, 32).amax(1)
    assert torch.all(error <= step / 2 + 1e-5)


def test_quantization_is_refused_off_the_cpu():
    with pytest.raises(ValueError, match="CPU only"):
        Linear(torch.empty(32, 64, device="meta"), quantization="int4")


def test_int4_needs_whole_groups():
    with pytest.raises(ValueError, match="divisible by 32"):
        Linear(torch.randn(16, 48), quantization="int4")
    with pytest.raises(ValueError, match="divisible by 16"):
        Linear(torch.randn(8, 64), quantization="int4")


def test_unknown_quantization_is_rejected():
    with pytest.raises(ValueError, match="quantization"):
        Linear(torch.randn(4, 4), quantization="int3")


def _last_token_logits(hf_model, prompt) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([prompt])).logits[0, -1]


def test_mixed_step_with_grouped_fresh_prefills_matches_hf(tiny_llama):
    """Fresh prompts of equal length that are not adjacent in the batch (a decode and
    a chunk with a cached prefix sit between them) are attended as one group."""
    runner = _runner(tiny_llama)
    decode_prompt, continued = [7, 8, 9, 10, 11], [20, 21, 22, 23, 24, 25]
    runner.step(StepBatch(chunks=(_chunk(0, decode_prompt, 0, [1, 2]),)))
    runner.step(StepBatch(chunks=(_chunk(1, continued[:3], 0, [3, 4], sample=False),)))
    decode_token = 42
    fresh = {2: [5, 17, 99, 4], 3: [250, 11, 3], 4: [31, 32, 33, 34], 5: [60, 61, 62]}
    chunks = (
        _chunk(2, fresh[2], 0, [5]),
        _chunk(0, [decode_token], 5, [1, 2]),
        _chunk(3, fresh[3], 0, [6]),
        _chunk(1, continued[3:], 3, [3, 4]),
        _chunk(4, fresh[4], 0, [7]),
        _chunk(5, fresh[5], 0, [8]),
    )
    got = runner.forward_logits(StepBatch(chunks=chunks))
    prompts = [
        fresh[2],
        [*decode_prompt, decode_token],
        fresh[3],
        continued,
        fresh[4],
        fresh[5],
    ]
    want = torch.stack([_last_token_logits(tiny_llama, p) for p in prompts])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("quantization", "min_cosine"), [(None, 0.99), ("int8", 0.99), ("int4", 0.95)])
def test_bfloat16_and_quantized_runners_stay_close_to_float32(tiny_llama, quantization, min_cosine):
    prompts = [[5, 17, 99, 4, 203, 76, 31], [250, 11, 9, 9, 9, 9, 9]]
    chunks = tuple(_chunk(i, p, 0, [1 + 2 * i, 2 + 2 * i]) for i, p in enumerate(prompts))
    want = _runner(tiny_llama).forward_logits(StepBatch(chunks=chunks))
    runner = _runner(tiny_llama, dtype=torch.bfloat16, quantization=quantization)
    got = runner.forward_logits(StepBatch(chunks=chunks))
    assert got.dtype is torch.float32
    cos = F.cosine_similarity(got, want, dim=-1)
    assert cos.min() > min_cosine
