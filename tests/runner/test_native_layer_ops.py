"""The native (C) layer ops against the torch reference: RMSNorm, residual add +
RMSNorm, SiLU-and-multiply and RoPE with the KV-cache store, in bfloat16 and
float32, their fallbacks, and a bfloat16 runner built on them."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from sluiceway.engine.batch import ScheduledChunk, StepBatch
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.models.rope import apply_rope
from sluiceway.runner.native.layer_ops import NativeLayerOps, TorchLayerOps, layer_ops_for

from .conftest import make_runner

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

REFERENCE = TorchLayerOps()
# 1 row (a decode step), a few rows, and enough rows (40 x 576) for the parallel path.
SHAPES = [(1, 576), (7, 64), (40, 576)]


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float32], ids=["bf16", "f32"])
def native(request) -> NativeLayerOps:
    ops = layer_ops_for(request.param, torch.device("cpu"), native=True, exact_float32=False)
    assert isinstance(ops, NativeLayerOps) and ops.dtype is request.param
    return ops


def _t(ops: NativeLayerOps, *shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    """Random values in the ops' dtype."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(ops.dtype)


def _assert_within_rounding(got: torch.Tensor, want: torch.Tensor) -> None:
    # One rounding apart at most: the relative step of bfloat16 is 2**-8, float32's
    # 2**-24 (summed in another order: a few steps).
    rtol = 2**-7 if got.dtype == torch.bfloat16 else 2**-20
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize(("rows", "dim"), SHAPES)
def test_rms_norm(native, rows, dim):
    x, weight = _t(native, rows, dim, seed=1, scale=3.0), _t(native, dim, seed=2)
    _assert_within_rounding(
        native.rms_norm(x, weight, 1e-5), REFERENCE.rms_norm(x, weight, 1e-5)
    )


@pytest.mark.parametrize(("rows", "dim"), SHAPES)
def test_add_rms_norm_updates_the_residual_like_torch(native, rows, dim):
    residual = _t(native, rows, dim, seed=3)
    delta, weight = _t(native, rows, dim, seed=4), _t(native, dim, seed=5)
    want_hidden, want_normed = REFERENCE.add_rms_norm(residual, delta, weight, 1e-6)
    hidden, normed = native.add_rms_norm(residual.clone(), delta, weight, 1e-6)
    # The add rounds to the dtype exactly as torch's does.
    assert torch.equal(hidden, want_hidden)
    _assert_within_rounding(normed, want_normed)


@pytest.mark.parametrize(("rows", "dim"), SHAPES)
def test_silu_mul(native, rows, dim):
    # Large gates on both sides: sigmoid must neither overflow nor lose its sign.
    gate_up = _t(native, rows, 2 * dim, seed=6, scale=8.0)
    _assert_within_rounding(native.silu_mul(gate_up), REFERENCE.silu_mul(gate_up))


HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def _rope_case(ops: NativeLayerOps, rows: int, seed: int):
    qkv = _t(ops, rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, seed=seed, scale=4.0)
    cos = _t(ops, rows, 1, HEAD_DIM, seed=seed + 1)
    sin = _t(ops, rows, 1, HEAD_DIM, seed=seed + 2)
    cache = KVCache.allocate(
        num_layers=1,
        num_blocks=64,
        block_size=16,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        dtype=ops.dtype,
    )
    gen = torch.Generator().manual_seed(seed + 3)
    slots = torch.randperm(64 * 16, generator=gen)[:rows]
    return qkv, cos, sin, cache, slots


@pytest.mark.parametrize("rows", [1, 7, 300])  # 300 rows take the parallel path
def test_rope_and_cache_is_apply_rope_and_the_cache_write_bit_for_bit(native, rows):
    qkv, cos, sin, cache, slots = _rope_case(native, rows, seed=rows)
    qk = qkv[:, : (HEADS + KV_HEADS) * HEAD_DIM].view(rows, HEADS + KV_HEADS, HEAD_DIM)
    want_q, want_k = apply_rope(qk, cos, sin).split([HEADS, KV_HEADS], dim=1)
    want_v = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM :].view(rows, KV_HEADS, HEAD_DIM)
    want_cache = KVCache(
        [torch.zeros_like(cache.key_caches[0])], [torch.zeros_like(cache.value_caches[0])], 16
    )
    want_cache.write(0, slots, want_k, want_v)

    fused = native.rope_and_cache(
        qkv.clone(), cos, sin, HEADS, slots, cache.key_caches[0], cache.value_caches[0]
    )
    assert fused is not None
    q, k, v = fused
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, want_v)
    assert torch.equal(cache.key_caches[0], want_cache.key_caches[0])
    assert torch.equal(cache.value_caches[0], want_cache.value_caches[0])


def test_rope_and_cache_refuses_a_slot_outside_the_cache_and_writes_nothing(native):
    qkv, cos, sin, cache, slots = _rope_case(native, 3, seed=11)
    slots[2] = 64 * 16  # one past the last slot
    with pytest.raises(IndexError, match="outside the cache"):
        native.rope_and_cache(
            qkv, cos, sin, HEADS, slots, cache.key_caches[0], cache.value_caches[0]
        )
    assert not cache.key_caches[0].any() and not cache.value_caches[0].any()


def test_rope_and_cache_leaves_what_it_does_not_take_to_the_caller(native):
    qkv, cos, sin, cache, slots = _rope_case(native, 2, seed=12)
    caches = (cache.key_caches[0], cache.value_caches[0])
    assert REFERENCE.rope_and_cache(qkv, cos, sin, HEADS, slots, *caches) is None
    other = torch.float32 if native.dtype == torch.bfloat16 else torch.bfloat16
    assert native.rope_and_cache(qkv.to(other), cos, sin, HEADS, slots, *caches) is None
    assert native.rope_and_cache(qkv, cos, sin, HEADS, slots.to(torch.int32), *caches) is None
    assert not caches[0].any()


def test_what_the_kernels_do_not_take_goes_to_torch(native):
    other = torch.float32 if native.dtype == torch.bfloat16 else torch.bfloat16
    x, w = torch.randn(3, 64).to(other), torch.randn(64).to(other)
    assert torch.equal(native.rms_norm(x, w, 1e-5), REFERENCE.rms_norm(x, w, 1e-5))
    strided = _t(native, 64, 3, seed=7).t()  # not contiguous
    weight = _t(native, 64, seed=8)
    assert torch.equal(
        native.rms_norm(strided, weight, 1e-5), REFERENCE.rms_norm(strided, weight, 1e-5)
    )
    gate_up = torch.randn(2, 8).to(other)
    assert torch.equal(native.silu_mul(gate_up), REFERENCE.silu_mul(gate_up))


def test_exact_float32_keeps_torch_ops():
    """Unquantized float32 models stay bit-for-bit transformers: torch's ops."""
    assert isinstance(layer_ops_for(torch.float32, torch.device("cpu")), TorchLayerOps)
    assert isinstance(layer_ops_for(torch.bfloat16, torch.device("cpu"), False), TorchLayerOps)
    with pytest.raises(ValueError, match="bfloat16"):
        layer_ops_for(torch.float32, torch.device("cpu"), native=True)


def test_quantized_float32_models_run_on_native_ops(tiny_llama):
    runner = make_runner(tiny_llama, num_blocks=16, quantization="int4")
    ops = runner.model.ops
    assert isinstance(ops, NativeLayerOps) and ops.dtype is torch.float32


def test_bfloat16_runner_on_native_ops_matches_torch_ops(tiny_llama):
    """Prefill and two decode steps of two sequences, native layer ops and decode
    attention against torch ops and SDPA, in bfloat16."""
    greedy = SamplingParams(temperature=0.0)
    logits = {}
    for native_ops in (False, True):  # the reference first: its picks drive both
        runner = make_runner(tiny_llama, num_blocks=16, dtype=torch.bfloat16)
        if not native_ops:
            runner.model.ops = TorchLayerOps()
            runner.attention.native_decode = False  # type: ignore[attr-defined]
        tokens = [[5, 17, 99, 4, 203, 76, 31], [250, 11, 9]]
        done = [0, 0]
        steps = []
        for _ in range(3):
            chunks = tuple(
                ScheduledChunk(
                    seq_id=i,
                    token_ids=toks[done[i] :],
                    start_pos=done[i],
                    block_table=[1 + 4 * i, 2 + 4 * i, 3 + 4 * i],
                    sample=True,
                    params=greedy,
                )
                for i, toks in enumerate(tokens)
            )
            batch = StepBatch(chunks=chunks)
            steps.append(runner.forward_logits(batch))
            # Both runners continue with the same tokens (the reference's picks).
            picks = logits[False][len(steps) - 1] if False in logits else steps[-1]
            for i, row in enumerate(picks.argmax(dim=-1).tolist()):
                done[i] = len(tokens[i])
                tokens[i].append(row)
        logits[native_ops] = steps
    for got, want in zip(logits[True], logits[False], strict=True):
        assert F.cosine_similarity(got, want, dim=-1).min() > 0.999
