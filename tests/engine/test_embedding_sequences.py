"""Embedding sequences in the engine: prefill-only, pooled over every chunk,
batched with generation, recomputed after preemption, and aborted like any other."""

import pytest
import trio
from engine_fakes import EOS, ByteTokenizer, PoolingScriptedRunner, ScriptedRunner, core_over, drain

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
    core, runner = make_core(pooling, budget=4)
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


def test_embeddings_and_generation_share_steps():
    core, runner = make_core("mean", budget=64)
    (gen,) = core.add_request(0, tok.encode("abc"), SamplingParams(max_tokens=3))
    (emb,) = core.add_request(1, tok.encode("xyz"), SamplingParams(max_tokens=1), pooling="mean")
    out = drain(core)
    assert len(runner.batches[0].chunks) == 2  # one step held both prompts
    assert out[emb][0].embedding == pytest.approx(expected(tok.encode("xyz"), "mean"))
    assert "".join(d.text for d in out[gen]) == "def"
    assert core.stats().generation_tokens_total == 3  # the embedding generated nothing


def test_a_mean_embedding_reads_every_token_even_when_its_prefix_is_cached():
    core, runner = make_core("mean", budget=64)
    prompt = tok.encode("abcdefghij")
    core.add_request(0, prompt, SamplingParams(max_tokens=2))
    drain(core)
    (seq_id,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling="mean")
    out = drain(core)
    assert out[seq_id][0].embedding == pytest.approx(expected(prompt, "mean"))
    assert len(runner.batches[-1].chunks[0].token_ids) == len(prompt)


def test_a_last_embedding_reuses_the_cached_prefix():
    core, runner = make_core("last", budget=64)
    prompt = tok.encode("abcdefghij")
    core.add_request(0, prompt, SamplingParams(max_tokens=2))
    drain(core)
    (seq_id,) = core.add_request(1, prompt, SamplingParams(max_tokens=1), pooling="last")
    out = drain(core)
    assert out[seq_id][0].embedding == pytest.approx(expected(prompt, "last"))
    assert out[seq_id][0].num_cached_prompt_tokens == 8
    assert len(runner.batches[-1].chunks[0].token_ids) == 2


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
    assert len(runner.batches) == 1  # the burst was prefilled together


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
