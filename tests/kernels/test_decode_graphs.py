"""Bucketed decode through `DecodeGraphs`: padded to a bucket it gives the eager
path's logits, tokens and KV cache, and padding rows touch no cache slot.

On CPU the static buffers run without capture (triton's interpreter); on a CUDA
device the same tests capture and replay real graphs."""

from __future__ import annotations

import copy
import random
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton", reason="triton is not importable; the paged KV-cache kernels need it")
transformers = pytest.importorskip("transformers")

from sluiceway.engine.batch import ScheduledChunk, StepBatch  # noqa: E402
from sluiceway.engine.sampling_params import SamplingParams  # noqa: E402
from sluiceway.runner.attention import TorchAttention  # noqa: E402
from sluiceway.runner.decode_graphs import (  # noqa: E402
    DecodeGraphs,
    default_batch_sizes,
    pick_bucket,
)
from sluiceway.runner.kernels.backend import TritonAttention  # noqa: E402
from sluiceway.runner.model_runner import TorchModelRunner  # noqa: E402
from sluiceway.runner.sampler import sample  # noqa: E402
from tiny_models import TINY_LLAMA  # noqa: E402

BLOCK_SIZE = 16
BUCKETS = (1, 2, 4)
MAX_SEQS = 5
# Sequence i owns blocks 1 + 2i and 2 + 2i; block 0 and the last block stay unused,
# so a stray write through a padding row (slot -1 wrapping around, or a table padded
# with 0) would show up there.
NUM_BLOCKS = 2 * MAX_SEQS + 2
SENTINEL = 7.0
GREEDY = SamplingParams(temperature=0.0, max_tokens=None)
TINY = dict(TINY_LLAMA, vocab_size=256)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
    state = transformers.LlamaForCausalLM(config).state_dict()
    # Random init gives near-uniform logits; spread them so that greedy choices
    # never hinge on the last bit a GEMM over more rows may round differently.
    state["lm_head.weight"] = state["lm_head.weight"] * 50
    return config, state


def _runner(tiny, device, *, graphs: bool) -> TorchModelRunner:
    config, state = tiny
    runner = TorchModelRunner(
        config,
        state,
        device=device,
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        attention=TritonAttention,
        cuda_graphs=graphs,
        graph_batch_sizes=BUCKETS,
    )
    for cache in (*runner.kv_cache.key_caches, *runner.kv_cache.value_caches):
        cache.fill_(SENTINEL)
    return runner


def _table(i: int) -> list[int]:
    return [1 + 2 * i, 2 + 2 * i]


def _record_forward_rows(runner: TorchModelRunner) -> list[int]:
    """Rows of every eager `model.forward` call from now on (a replay makes none)."""
    rows: list[int] = []
    forward = runner.model.forward

    def spy(input_ids, *args):
        rows.append(input_ids.shape[0])
        return forward(input_ids, *args)

    runner.model.forward = spy  # type: ignore[method-assign]
    return rows


@pytest.mark.parametrize("n", [3, 4, 5], ids=["below-bucket", "at-bucket", "above-largest"])
def test_bucketed_decode_matches_eager(tiny, device, n):
    """Teacher-forced: both runners see the same tokens; prompts of 13 .. 17 tokens
    decode across a block boundary."""
    graphs, eager = _runner(tiny, device, graphs=True), _runner(tiny, device, graphs=False)
    rows = _record_forward_rows(graphs)
    rng = random.Random(n)
    prompts = [[rng.randrange(TINY["vocab_size"]) for _ in range(13 + i)] for i in range(n)]
    steps = [
        tuple(
            ScheduledChunk(seq_id=i, token_ids=p, start_pos=0, block_table=_table(i),
                           sample=True, params=GREEDY)
            for i, p in enumerate(prompts)
        )
    ]  # fmt: skip
    for step in range(5):
        steps.append(
            tuple(
                ScheduledChunk(seq_id=i, token_ids=[rng.randrange(TINY["vocab_size"])],
                               start_pos=len(p) + step, block_table=_table(i), sample=True,
                               params=GREEDY)
                for i, p in enumerate(prompts)
            )
        )  # fmt: skip
    for chunks in steps:
        want = eager.forward_logits(StepBatch(chunks=chunks))
        got = graphs.forward_logits(StepBatch(chunks=chunks))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    bucket = pick_bucket(BUCKETS, n)
    assert graphs.decode_graphs is not None
    if bucket is None:
        decode_rows = [n] * 5  # beyond the largest bucket: eager
    elif graphs.decode_graphs.captured:
        decode_rows = []  # replays only
    else:
        decode_rows = [bucket] * 5  # eager replay over the padded static buffers
    assert rows == [sum(map(len, prompts)), *decode_rows]

    for got, want in zip(
        (*graphs.kv_cache.key_caches, *graphs.kv_cache.value_caches),
        (*eager.kv_cache.key_caches, *eager.kv_cache.value_caches),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert bool((got[0] == SENTINEL).all()) and bool((got[-1] == SENTINEL).all())


def test_greedy_generation_matches_eager_as_the_batch_shrinks(tiny, device):
    """Sequences finish at different steps, so decode runs at buckets 4, 2 and 1."""
    max_new = [6, 4, 2]
    outputs = []
    for runner in (_runner(tiny, device, graphs=True), _runner(tiny, device, graphs=False)):
        tokens = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5][: 9 + i] for i in range(3)]
        done = [0, 0, 0]
        out: list[list[int]] = [[], [], []]
        while any(len(o) < m for o, m in zip(out, max_new, strict=True)):
            chunks = tuple(
                ScheduledChunk(seq_id=i, token_ids=t[done[i]:], start_pos=done[i],
                               block_table=_table(i), sample=True, params=GREEDY)
                for i, t in enumerate(tokens)
                if len(out[i]) < max_new[i]
            )  # fmt: skip
            for c in chunks:
                done[c.seq_id] = len(tokens[c.seq_id])
            for s in runner.step(StepBatch(chunks=chunks)):
                out[s.seq_id].append(s.token_id)
                tokens[s.seq_id].append(s.token_id)
        outputs.append(out)
    assert outputs[0] == outputs[1]
    assert [len(o) for o in outputs[0]] == max_new


def test_steps_that_are_not_plain_decode_are_left_to_the_eager_path(tiny, device):
    runner = _runner(tiny, device, graphs=True)
    graphs = runner.decode_graphs
    assert isinstance(graphs, DecodeGraphs)

    def chunk(i, tokens, start, sample=True):
        return ScheduledChunk(seq_id=i, token_ids=tokens, start_pos=start,
                              block_table=_table(i), sample=sample, params=GREEDY)  # fmt: skip

    assert graphs.run([chunk(0, [5], 3), chunk(1, [6, 7], 2)]) is None  # mixed
    assert graphs.run([chunk(0, [5], 3, sample=False)]) is None  # a one-token prefill chunk
    assert graphs.run([chunk(i, [5], 3) for i in range(5)]) is None  # beyond bucket 4
    assert graphs.run([]) is None
    too_long = ScheduledChunk(seq_id=0, token_ids=[5], start_pos=NUM_BLOCKS * BLOCK_SIZE,
                              block_table=list(range(NUM_BLOCKS + 1)), sample=True,
                              params=GREEDY)  # fmt: skip
    assert graphs.run([too_long]) is None
    for cache in runner.kv_cache.key_caches:
        assert bool((cache == SENTINEL).all())  # nothing ran


def test_bucket_choice_and_defaults():
    assert [pick_bucket(BUCKETS, n) for n in range(1, 6)] == [1, 2, 4, 4, None]
    assert default_batch_sizes(1000) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert default_batch_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert default_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert default_batch_sizes(1) == (1,)


def test_cuda_graphs_option(tiny, device):
    config, state = tiny

    def build(**kwargs):
        return TorchModelRunner(config, state, device=device, block_size=BLOCK_SIZE,
                                num_blocks=NUM_BLOCKS, **kwargs)  # fmt: skip

    with pytest.raises(ValueError, match="graph-safe"):
        build(attention=TorchAttention, cuda_graphs=True)
    assert build(attention=TorchAttention).decode_graphs is None
    assert build(attention=TritonAttention, cuda_graphs=False).decode_graphs is None
    auto = build(attention=TritonAttention).decode_graphs
    if torch.device(device).type == "cuda":
        assert auto is not None and auto.captured
        assert auto.batch_sizes == default_batch_sizes(NUM_BLOCKS)
    else:
        assert auto is None  # no GPU: no graphs unless asked for


def test_cuda_graphs_are_refused_for_sliding_window_layers(tiny, device):
    # Their masked attention plans on the host each step, which a graph cannot replay.
    config, state = tiny
    windowed = copy.deepcopy(config)
    windowed.sliding_window = 8
    with pytest.raises(ValueError, match="sliding windows or soft caps"):
        TorchModelRunner(windowed, state, device=device, block_size=BLOCK_SIZE,
                         num_blocks=NUM_BLOCKS, attention=TritonAttention, cuda_graphs=True)  # fmt: skip
    auto = TorchModelRunner(windowed, state, device=device, block_size=BLOCK_SIZE,
                            num_blocks=NUM_BLOCKS, attention=TritonAttention)  # fmt: skip
    assert auto.decode_graphs is None


def _count_syncs(fn) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampling_on_cuda_syncs_once_and_agrees_with_cpu():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 300, generator=gen) * 3
    chunks = [
        ScheduledChunk(seq_id=i, token_ids=[1], start_pos=0, block_table=[0], sample=True,
                       params=SamplingParams(temperature=0.0 if i % 2 else 0.8, top_k=5 * i,
                                             top_p=0.9, logprobs=i % 3 or None),
                       step_seed=i)
        for i in range(8)
    ]  # fmt: skip
    on_cuda = logits.cuda()
    sample(on_cuda, chunks)  # warm up kernels and generators
    assert _count_syncs(lambda: sample(on_cuda, chunks)) <= 1
    got, want = sample(on_cuda, chunks), sample(logits, chunks)
    for g, w, c in zip(got, want, chunks, strict=True):
        assert [t for t, _ in g.top_logprobs] == [t for t, _ in w.top_logprobs]
        if c.params.greedy:  # seeded draws differ between CPU and CUDA generators
            assert g.token_id == w.token_id
            assert g.logprob == pytest.approx(w.logprob, abs=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_decode_step_syncs_once(tiny):
    runner = _runner(tiny, "cuda", graphs=True)
    prompts = [[5, 6, 7], [8, 9]]
    runner.step(StepBatch(chunks=tuple(
        ScheduledChunk(seq_id=i, token_ids=p, start_pos=0, block_table=_table(i), sample=True,
                       params=GREEDY)
        for i, p in enumerate(prompts)
    )))  # fmt: skip
    decode = StepBatch(chunks=tuple(
        ScheduledChunk(seq_id=i, token_ids=[1], start_pos=len(p), block_table=_table(i),
                       sample=True, params=GREEDY)
        for i, p in enumerate(prompts)
    ))  # fmt: skip
    assert _count_syncs(lambda: runner.step(decode)) <= 1
