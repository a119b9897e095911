"""Embedding sequences in the engine: prefill-only, pooled over every chunk,
each chunk of a fixed size and run as a batch of its own (so a vector never
depends on what shares its steps), recomputed after preemption, and aborted like
any other."""

import pytest
import trio
from engine_fakes import EOS, ByteTokenizer, PoolingScriptedRunner, ScriptedRunner, core_over, drain
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.config import EngineConfig
from sluiceway.engine.engine import Engine
from sluiceway.engine.errors import PromptTooLongError
from sluiceway.engine.pooling import PoolingSpec
from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()


def make_core(pooling="mean", num_blocks=64, budget=4, max_num_seqs=8):
    runner = PoolingScriptedRunner(
        num_blocks=num_blocks, block_size=4, pooling=PoolingSpec(pooling, 3)
    )
    return core_over(runner, max_num_seqs=max_num_seqs, budget=budget, max_model_len=64), runner


def expected(prompt, pooling):
    rows = [(float(t), float(i), 1.0) for i, t in enumerate(prompt)]
    if pooling == "last":
        return rows[-1]
    return tuple(sum(col) / len(rows) for col in zip(*rows, strict=True))


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_an_embedding_pools_every_chunk_of_its_prompt_and_samples_nothing(pooling):
    # One slot: an embedding chunk is the whole budget.
    core, runner = make_core(pooling, budget=4, max_num_seqs=1)
    assert core.scheduler.embedding_chunk_tokens == 4
    prompt = tok.encode("abcdefghijk")  # three chunks of at most four tokens
    (seq_id,) = core.add_request(0, prompt, SamplingParams(max_tokens=1), pooling=pooling)
    out = drain(core)
    (delta,) = out[seq_id]
    assert delta.embedding == pytest.approx(expected(prompt, pooling))
    assert delta.finish_reason == "stop" and delta.token_ids == ()
    assert delta.num_prompt_tokens == len(prompt)
    assert [len(b.chunks[0].token_ids) for b in runner.batches] == [4, 4, 3]
    assert not any(c.sample for b in runner.batches for c in b.chunks)
    # Mean pools every chunk; last asks only the chunk that ends the prompt.
    asked = [c.pooling for b in runner.batches for c in b.chunks]
    assert asked == (["mean"] * 3 if pooling == "mean" else [None, None, "last"])
    assert core.stats().kv_blocks_used == 0 and not core.has_work()


def test_embeddings_share_steps_with_generation_but_never_a_batch():
    core, runner = make_core("mean", budget=64)
    (gen,) = core.add_request(0, tok.encode("abc"), SamplingParams(max_tokens=3))
    (emb,) = core.add_request(1, tok.encode("xyz"), SamplingParams(max_tokens=1), pooling="mean")
    first = dict(core.step())
    # One step ran both prompts: the embedding's chunk alone, first, then the rest.
    assert [[c.seq_id for c in b.chunks] for b in runner.batches] == [[emb], [gen]]
    assert first[emb].embedding == pytest.approx(expected(tok.encode("xyz"), "mean"))
    out = drain(core)
    assert "".join(d.text for d in [first[gen], *out[gen]]) == "def"
    assert core.stats().generation_tokens_total == 3  # the embedding generated nothing


def test_an_embedding_chunk_is_never_cut_to_what_a_step_has_left():
    # Budget 12, 4 slots: embedding chunks are 9 tokens (room for three decodes).
    core, runner = make_core("mean", budget=12, max_num_seqs=4)
    assert core.scheduler.embedding_chunk_tokens == 9
    (gen,) = core.add_request(0, tok.encode("abcdefgh"), SamplingParams(max_tokens=4))
    prompt = tok.encode("ABCDEFGHIJKLMNOPQRST")  # 20 tokens: chunks of 9, 9 and 2
    (emb,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling="mean")
    out = drain(core)
    chunks = [len(c.token_ids) for b in runner.batches for c in b.chunks if c.seq_id == emb]
    assert chunks == [9, 9, 2]
    # The generation's 8-token prompt left 4 tokens of the first step: too few.
    assert [c.seq_id for c in runner.batches[0].chunks] == [gen]
    assert out[emb][0].embedding == pytest.approx(expected(prompt, "mean"))


def test_a_mean_embedding_reads_every_token_even_when_its_prefix_is_cached():
    core, runner = make_core("mean", budget=64)
    prompt = tok.encode("abcdefghij")
    core.add_request(0, prompt, SamplingParams(max_tokens=2))
    drain(core)
    (seq_id,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling="mean")
    out = drain(core)
    assert out[seq_id][0].embedding == pytest.approx(expected(prompt, "mean"))
    assert len(runner.batches[-1].chunks[0].token_ids) == len(prompt)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_an_embedding_never_reuses_the_cached_prefix(pooling):
    # Cached keys and values were computed in another batch; reused, they would
    # make the vector depend on that batch.
    core, runner = make_core(pooling, budget=64)
    prompt = tok.encode("abcdefghij")
    core.add_request(0, prompt, SamplingParams(max_tokens=2))
    drain(core)
    (seq_id,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling=pooling)
    out = drain(core)
    assert out[seq_id][0].embedding == pytest.approx(expected(prompt, pooling))
    assert out[seq_id][0].num_cached_prompt_tokens == 0
    assert len(runner.batches[-1].chunks[0].token_ids) == len(prompt)


def test_a_preempted_mean_embedding_starts_its_sum_again():
    # Six blocks of four: the generation outgrows what is left while the
    # embedding is between chunks, and the embedding, admitted last, is preempted.
    core, runner = make_core("mean", num_blocks=6, budget=8)
    (gen,) = core.add_request(
        0, tok.encode("abcdefgh"), SamplingParams(max_tokens=12, ignore_eos=True)
    )
    prompt = tok.encode("ABCDEFGHIJKLMNOP")
    (emb,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling="mean")
    out = drain(core)
    assert core.stats().num_preemptions_total >= 1
    ran = sum(len(c.token_ids) for b in runner.batches for c in b.chunks if c.seq_id == emb)
    assert ran > len(prompt)  # part of it ran twice
    assert out[emb][0].embedding == pytest.approx(expected(prompt, "mean"))
    assert len(out[gen]) == 12


def test_embedding_lengths_may_fill_the_context_and_runners_must_pool():
    core, _ = make_core("mean")
    core.add_request(0, [1] * 64, SamplingParams(max_tokens=1), pooling="mean")
    with pytest.raises(PromptTooLongError):
        core.add_request(1, [1] * 65, SamplingParams(max_tokens=1), pooling="mean")
    plain = core_over(ScriptedRunner(), max_num_seqs=4, max_model_len=64)
    assert plain.pooling is None
    with pytest.raises(ValueError, match="does not produce embeddings"):
        plain.add_request(0, [1, 2], SamplingParams(max_tokens=1), pooling="mean")


def make_engine(runner):
    return Engine(runner, tok, EngineConfig(), eos_token_ids=[EOS], max_model_len=64)


async def test_embed_returns_the_pooled_state_of_concurrent_requests(autojump_clock):
    runner = PoolingScriptedRunner(num_blocks=64, block_size=4)
    engine = make_engine(runner)
    results = {}

    async def embed(text):
        results[text] = (await engine.embed(tok.encode(text), group="one request")).embedding

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for text in ("first", "second", "third"):
                clients.start_soon(embed, text)
        nursery.cancel_scope.cancel()
    for text, embedding in results.items():
        assert embedding == pytest.approx(expected(tok.encode(text), "mean"))
    # The burst was prefilled in one engine step, each input in a batch of its own.
    assert [len(b.chunks) for b in runner.batches] == [1, 1, 1]


async def test_a_cancelled_embed_leaves_the_engine(autojump_clock):
    runner = PoolingScriptedRunner(num_blocks=64, block_size=4)
    engine = make_engine(runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.move_on_after(0):  # cancelled before its first step
            await engine.embed(tok.encode("abcdef"))
        await engine.wait_idle()
        assert runner.batches == []  # it never reached the model
        assert engine.stats().num_running_seqs == 0 and engine.stats().kv_blocks_used == 0
        nursery.cancel_scope.cancel()


async def test_embed_on_a_runner_without_pooling_is_refused():
    engine = make_engine(ScriptedRunner())
    assert engine.pooling is None
    with pytest.raises(ValueError):
        await engine.embed([1, 2, 3])


embedding_mix = st.lists(
    # (prompt length, an embedding?, background?)
    st.tuples(st.integers(1, 30), st.booleans(), st.booleans()),
    min_size=1,
    max_size=6,
)


@settings(max_examples=100, deadline=None)
@given(embedding_mix, st.integers(1, 4), st.integers(4, 16), st.sampled_from(["mean", "last"]))
def test_every_embedding_chunk_runs_alone_at_the_fixed_size(reqs, max_seqs, budget, pooling):
    core, runner = make_core(pooling, num_blocks=64, budget=budget, max_num_seqs=max_seqs)
    size = core.scheduler.embedding_chunk_tokens
    embeddings = {}
    for rid, (length, embedding, background) in enumerate(reqs):
        prompt = [ord("a") + (rid + i) % 7 for i in range(length)]
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        pool = pooling if embedding else None
        (seq_id,) = core.add_request(rid, prompt, params, pooling=pool, background=background)
        if embedding:
            embeddings[seq_id] = prompt
    out = drain(core)
    for seq_id, prompt in embeddings.items():
        assert out[seq_id][0].embedding == pytest.approx(expected(prompt, pooling))
        chunks = [b.chunks for b in runner.batches if any(c.seq_id == seq_id for c in b.chunks)]
        assert all(len(c) == 1 for c in chunks)
        sizes = [len(c[0].token_ids) for c in chunks]
        whole, rest = divmod(len(prompt), size)
        assert sizes == [size] * whole + ([rest] if rest else [])
    assert core.stats().kv_blocks_used == 0
