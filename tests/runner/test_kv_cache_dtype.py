"""KV caches stored as int8 or fp8 codes with a scale per row (`--kv-cache-dtype`):
the codes and their error bounds, the bytes a block takes, every attention path
that reads such a cache (the native decode kernel, portable and vectorised, with
bfloat16 and float32 queries; the SDPA gathers) against a reference over the
dequantized rows, and a model served end to end on each."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F
from tests.runner.test_native_decode import _decode_meta, _step_rows

from sluiceway.config import EngineConfig
from sluiceway.runner.attention import TorchAttention
from sluiceway.runner.kernels.backend import select_attention_backend
from sluiceway.runner.kv_cache import (
    KVCache,
    dequantize_rows,
    kv_cache_bytes_per_block,
    kv_cache_format,
    quantize_rows,
)
from sluiceway.runner.native.paged_decode import native_decode_available, paged_decode

QUANTIZED = ("int8", "fp8")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _cache(
    name: str,
    dtype: torch.dtype,
    *,
    layers: int,
    blocks: int,
    block_size: int,
    kv_heads: int,
    dim: int,
) -> KVCache:
    """An empty cache of format `name` for a model computing in `dtype`."""
    return KVCache.allocate(
        num_layers=layers,
        num_blocks=blocks,
        block_size=block_size,
        num_kv_heads=kv_heads,
        head_dim=dim,
        dtype=dtype,
        format=kv_cache_format(name, dtype),
    )


def _rows(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Rows of very different magnitudes, and one channel far above the rest (as
    # keys have): a scale per row must hold both.
    rows = torch.randn(*shape, generator=gen) * torch.logspace(-3, 2, shape[-2])[:, None]
    rows[..., 3] *= 20
    return rows


@pytest.mark.parametrize("name", QUANTIZED)
def test_codes_stay_within_their_formats_error(name):
    rows = _rows(5, 7, 64)
    codes, scales = quantize_rows(rows, name)
    assert scales.shape == (5, 7) and scales.dtype == torch.float32
    back = dequantize_rows(codes, scales, name, torch.float32)
    top = rows.abs().amax(-1, keepdim=True)
    error = (back - rows).abs()
    if name == "int8":
        assert codes.dtype == torch.int8
        assert codes.abs().amax() == 127  # each row's largest element takes the top code
        assert (error <= scales.unsqueeze(-1) / 2 * (1 + 1e-5)).all()
    else:
        assert codes.dtype == torch.uint8
        # e4m3 keeps 3 mantissa bits: half a unit in the last place is 2**-4 of
        # the value; below the normal range (2**-6 of the top code) a fixed step.
        floor = top / 448 * 2.0**-10
        assert (error <= rows.abs() * 2.0**-4 + floor).all()
    assert (back.abs().amax(-1) - top.squeeze(-1)).abs().max() <= 1e-5 * top.max()


@pytest.mark.parametrize("name", QUANTIZED)
def test_a_zero_row_is_zero(name):
    codes, scales = quantize_rows(torch.zeros(2, 16), name)
    assert torch.equal(scales, torch.zeros(2))
    assert torch.equal(dequantize_rows(codes, scales, name, torch.bfloat16), torch.zeros(2, 16))


def test_a_quantized_block_takes_about_half_of_bfloat16():
    shape = dict(num_layers=30, block_size=16, num_kv_heads=3, head_dim=64)
    bf16 = kv_cache_bytes_per_block(**shape, format=kv_cache_format("auto", torch.bfloat16))
    assert bf16 == kv_cache_bytes_per_block(**shape, dtype=torch.bfloat16)
    for name in QUANTIZED:
        quantized = kv_cache_bytes_per_block(**shape, format=kv_cache_format(name, torch.bfloat16))
        assert quantized == 2 * 30 * 16 * 3 * (64 + 4)  # codes and a float32 scale a row
    assert (
        kv_cache_bytes_per_block(**shape, format=kv_cache_format("float32", torch.bfloat16))
        == 2 * bf16
    )


def test_unknown_dtypes_are_refused():
    with pytest.raises(ValueError, match="unknown KV cache dtype 'int4'"):
        kv_cache_format("int4", torch.bfloat16)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int4")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", QUANTIZED)
def test_writes_are_read_back_dequantized(name):
    cache = _cache(name, torch.bfloat16, layers=2, blocks=4, block_size=4, kv_heads=2, dim=16)
    k, v = _rows(3, 2, 16, seed=1), _rows(3, 2, 16, seed=2)
    slots = torch.tensor([13, 2, 7])
    cache.write(1, slots, k, v)
    keys, values = cache.gather(1, torch.tensor([[3, 0], [1, 2]]))
    assert keys.shape == (2, 8, 2, 16) and keys.dtype == torch.bfloat16
    for got, rows in ((keys, k), (values, v)):
        flat = got.view(2, 2, 4, 2, 16)  # [sequence, block of its table, slot in block, ...]
        codes, scales = quantize_rows(rows, name)
        want = dequantize_rows(codes, scales, name, torch.bfloat16)
        assert torch.equal(flat[0, 0, 1], want[0])  # slot 13: block 3, offset 1
        assert torch.equal(flat[0, 1, 2], want[1])  # slot 2: block 0, offset 2
        assert torch.equal(flat[1, 0, 3], want[2])  # slot 7: block 1, offset 3
        assert torch.equal(flat[1, 1], torch.zeros(4, 2, 16, dtype=torch.bfloat16))  # never written
    assert torch.equal(
        cache.gather(0, torch.tensor([[3]]))[0], torch.zeros(1, 4, 2, 16, dtype=torch.bfloat16)
    )


@needs_cc
@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_native_store_writes_what_the_torch_one_does(name, dtype, monkeypatch):
    """Bit for bit, codes and scales: rows of every magnitude (fp8's subnormal
    range included), a zero row, and halfway cases of int8's rounding."""
    rows = _rows(6, 3, 64, seed=7)
    rows[1, 2] = 0.0
    rows[2, 0, :8] = torch.tensor([127.0, 0.5, 1.5, -2.5, 3.5, -0.5, 64.5, 100.0])
    rows = rows.to(dtype)
    slots = torch.tensor([9, 0, 31, 4, 17, 22])
    stored = {}
    for native in (True, False):
        if not native:
            monkeypatch.setattr("sluiceway.runner.kv_cache.store_quantized_rows", lambda *a: False)
        cache = _cache(name, dtype, layers=1, blocks=8, block_size=4, kv_heads=3, dim=64)
        cache.write(0, slots, rows, -rows)
        stored[native] = (
            cache.key_caches[0],
            cache.value_caches[0],
            cache.key_scales[0],
            cache.value_scales[0],
        )
    for native_tensor, torch_tensor in zip(stored[True], stored[False], strict=True):
        assert torch.equal(native_tensor, torch_tensor)
    assert stored[True][2].count_nonzero() > 0  # something was written


@needs_cc
def test_the_native_store_refuses_a_slot_outside_the_cache():
    cache = _cache("int8", torch.float32, layers=1, blocks=2, block_size=4, kv_heads=1, dim=16)
    rows = torch.ones(2, 1, 16)
    with pytest.raises(IndexError, match="outside the cache"):
        cache.write(0, torch.tensor([3, 8]), rows, rows)
    assert cache.key_scales[0].count_nonzero() == 0  # nothing written


def _quantized_case(name, heads, kv_heads, dim, lens, block_size=16, seed=0):
    """Scattered block tables over a cache of random rows written as `name`."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = max(-(-n // block_size) for n in lens) + 1
    num_blocks = len(lens) * per_seq + 3
    cache = _cache(
        name,
        torch.bfloat16,
        layers=1,
        blocks=num_blocks,
        block_size=block_size,
        kv_heads=kv_heads,
        dim=dim,
    )
    slots = torch.arange(num_blocks * block_size)
    k = torch.randn(len(slots), kv_heads, dim, generator=gen) * 3
    v = torch.randn(len(slots), kv_heads, dim, generator=gen)
    cache.write(0, slots, k, v)
    tables = torch.randperm(num_blocks, generator=gen)[: len(lens) * per_seq]
    tables = tables.view(len(lens), per_seq).to(torch.int32)
    q = torch.randn(len(lens), heads, dim, generator=gen)
    return cache, q, tables, torch.tensor(lens, dtype=torch.int32)


def _reference(cache: KVCache, q, tables, lens, scale):
    """Float32 attention over each context's dequantized rows, slot by slot."""
    keys, values = cache.gather(0, tables.to(torch.int64))
    outs = []
    for b, length in enumerate(lens.tolist()):
        k = keys[b, :length].float().transpose(0, 1)
        v = values[b, :length].float().transpose(0, 1)
        out = F.scaled_dot_product_attention(
            q[b].float()[:, None], k, v, scale=scale, enable_gqa=True
        )
        outs.append(out[:, 0])
    return torch.stack(outs)


@needs_cc
@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("portable", [False, True])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (8, 2, 128), (6, 1, 48)])
def test_native_decode_reads_quantized_rows(name, q_dtype, portable, heads, kv_heads, dim):
    cache, q, tables, lens = _quantized_case(name, heads, kv_heads, dim, [37, 1, 80])
    q = q.to(q_dtype)
    got = paged_decode(
        q,
        cache.key_caches[0],
        cache.value_caches[0],
        tables,
        lens,
        0.125,
        key_scales=cache.key_scales[0],
        value_scales=cache.value_scales[0],
        format=name,
        portable=portable,
    )
    assert got.dtype == q_dtype
    # The kernel scales each row in float32 where the gather rounds it to
    # bfloat16 first: agreement to bfloat16's resolution.
    want = _reference(cache, q, tables, lens, 0.125)
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)


@needs_cc
def test_the_kernel_wants_the_scales_of_a_quantized_cache():
    cache, q, tables, lens = _quantized_case("int8", 4, 2, 16, [5])
    with pytest.raises(ValueError, match="needs key_scales"):
        paged_decode(
            q, cache.key_caches[0], cache.value_caches[0], tables, lens, 0.1, format="int8"
        )
    with pytest.raises(ValueError, match="must be a CPU tensor of a fp8 cache"):  # int8 codes
        paged_decode(
            q,
            cache.key_caches[0],
            cache.value_caches[0],
            tables,
            lens,
            0.1,
            key_scales=cache.key_scales[0],
            value_scales=cache.value_scales[0],
            format="fp8",
        )


@needs_cc
@pytest.mark.parametrize("name", QUANTIZED)
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 5, 1], [3, 7, 2]])
def test_native_and_sdpa_read_a_quantized_cache_alike(name, query_lens):
    """Decode steps, decode rows inside a mixed step, and chunks that continue a
    cached context: the native kernel and the SDPA gathers, over one cache."""
    seq_lens = [37, 20, 9]
    q, k, v = _step_rows(sum(query_lens), 9, 3, 64, seed=3)
    outs = {}
    for native in (True, False):
        cache, _, tables, _ = _quantized_case(name, 9, 3, 64, seq_lens, seed=4)
        attention = TorchAttention(cache, native_decode=native)
        assert attention.native_decode is native
        meta = attention.prepare(_decode_meta(tables, seq_lens, query_lens, 16))
        outs[native] = attention.forward(0, q, k, v, meta)
    torch.testing.assert_close(outs[True].float(), outs[False].float(), atol=2e-2, rtol=2e-2)


def test_quantized_caches_choose_the_torch_backend():
    assert select_attention_backend("auto", "cpu", kv_cache_dtype="int8") is TorchAttention
    assert select_attention_backend("auto", "cuda", kv_cache_dtype="fp8") is TorchAttention
    with pytest.raises(ValueError, match="reads float KV caches, not int8"):
        select_attention_backend("triton", "cuda", kv_cache_dtype="int8")


def test_native_decode_is_offered_for_every_quantized_format():
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    for name in QUANTIZED:
        for compute in (torch.bfloat16, torch.float32):
            assert native_decode_available(name, compute, torch.device("cpu"))
    assert not native_decode_available("int8", torch.float16, torch.device("cpu"))


def _teacher_forced_logits(
    model, prompt: list[int], kv_cache_dtype: str, *, native_decode: bool | None = None
) -> torch.Tensor:
    """Logits of every position after the first 6 of `prompt`, each new token a
    decode step of its own: every step reads all earlier keys back from the cache."""
    from sluiceway.engine.batch import ScheduledChunk, StepBatch
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.runner.model_runner import TorchModelRunner

    runner = TorchModelRunner(
        model.config,
        model.state_dict(),
        block_size=4,
        num_blocks=16,
        kv_cache_dtype=kv_cache_dtype,
        attention=lambda cache: TorchAttention(cache, native_decode=native_decode),
    )
    assert runner.kv_cache.format.name == (
        "float32" if kv_cache_dtype == "auto" else kv_cache_dtype
    )
    table = list(range(1, 16))
    rows = []
    for end in range(6, len(prompt) + 1):
        start = 0 if end == 6 else end - 1
        chunk = ScheduledChunk(
            seq_id=0,
            token_ids=prompt[start:end],
            start_pos=start,
            block_table=table,
            sample=True,
            params=SamplingParams(temperature=0.0),
        )
        rows.append(runner.forward_logits(StepBatch(chunks=(chunk,)))[0])
    return torch.stack(rows)


@pytest.mark.parametrize("family", ["llama", "gemma2", "mistral-window"])
@pytest.mark.parametrize("name", QUANTIZED)
def test_a_model_decodes_over_a_quantized_cache(family, name):
    """Every attention path of a model reading int8 / fp8 rows (gemma2's soft
    caps and windows and mistral's window go through the masked path): the
    native decode kernel and the SDPA gathers give the same logits, which are
    not the float cache's (the rows really are quantized) and stay near
    transformers'. Tiny random models magnify any rounding (a bfloat16 cache
    moves these logits by up to 3% of the largest), hence the loose bounds; the
    default model's real weights are measured by `benchmarks/kv_cache_quality.py`."""
    from family_models import tiny

    model = tiny(family)
    prompt = [(7 * i + 3) % 256 for i in range(21)]
    with torch.no_grad():
        want = model(torch.tensor([prompt])).logits[0, 5:]
    exact = _teacher_forced_logits(model, prompt, "auto")
    torch.testing.assert_close(exact, want, rtol=1e-4, atol=1e-4)
    got = _teacher_forced_logits(model, prompt, name)
    gathered = _teacher_forced_logits(model, prompt, name, native_decode=False)
    torch.testing.assert_close(got, gathered, rtol=1e-4, atol=1e-4)
    assert not torch.equal(got, exact)
    error = (got - want).abs().max() / want.abs().max()
    assert error < (0.15 if name == "int8" else 0.5), error


@pytest.mark.parametrize("name", ["auto", "int8", "fp8"])
def test_the_flag_sizes_the_served_cache(tmp_path, name):
    """`--kv-cache-dtype` from the command line to the served runner: a memory
    budget holds as many blocks as the format's rows allow."""
    import argparse

    from gguf import GGMLQuantizationType

    from family_models import tiny
    from gguf_files import write_gguf
    from sluiceway import flags
    from sluiceway.config import ModelConfig
    from sluiceway.model_engine import load_bundle

    parser = argparse.ArgumentParser()
    flags.add_engine_flags(parser)
    engine = flags.engine_config(
        parser.parse_args(["--kv-cache-dtype", name, "--kv-cache-memory", "1MiB"])
    )
    assert engine.kv_cache_dtype == name
    model = tiny("llama")
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path, GGMLQuantizationType.F32)
    runner = load_bundle(
        ModelConfig(model=str(path), dtype="float32"), engine, progress=False
    ).runner
    cache = runner.kv_cache
    assert cache.format.name == ("float32" if name == "auto" else name)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    row = head_dim * 4 if name == "auto" else head_dim + 4
    per_block = 2 * config.num_hidden_layers * 16 * config.num_key_value_heads * row
    assert cache.num_blocks == (1 << 20) // per_block


def test_an_unknown_flag_value_is_refused(capsys):
    import argparse

    from sluiceway import flags

    parser = argparse.ArgumentParser()
    flags.add_engine_flags(parser)
    assert flags.engine_config(parser.parse_args([])).kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err
