"""Background sequences (Batch API lines) yield to every other: scheduled after
them and within `background_step_tokens` beside foreground work (whole steps
alone), paused while a foreground prompt runs or waits, first to lose blocks and slots; and their outputs are unchanged."""

from contextlib import AsyncExitStack

import pytest
from engine_fakes import EOS, ByteTokenizer, ScriptedRunner, core_over, drain

from sluiceway.config import EngineConfig
from sluiceway.engine.engine import Engine
from sluiceway.engine.errors import QueueFullError
from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()


def make_core(num_blocks=64, max_num_seqs=8, budget=32, background_step_tokens=6):
    runner = ScriptedRunner(num_blocks=num_blocks, block_size=4)
    core = core_over(
        runner,
        max_num_seqs=max_num_seqs,
        budget=budget,
        max_model_len=64,
        background_step_tokens=background_step_tokens,
    )
    return core, runner


def run_to_end(core):
    """Each sequence's text, once the core has finished them all."""
    return {seq_id: "".join(d.text for d in deltas) for seq_id, deltas in drain(core).items()}


def background_tokens(batch, ids):
    return sum(len(c.token_ids) for c in batch.chunks if c.seq_id in ids)


def test_background_prompts_take_their_share_beside_foreground_work_and_whole_steps_alone():
    core, runner = make_core(budget=32, background_step_tokens=6)
    core.add_request(0, tok.encode("a" * 20), SamplingParams(max_tokens=2), background=True)
    run_to_end(core)
    assert [b.num_tokens for b in runner.batches] == [20, 1]  # nothing else held
    runner.batches.clear()
    fg = set(
        core.add_request(1, tok.encode("b" * 4), SamplingParams(max_tokens=6, ignore_eos=True))
    )
    core.step()  # the foreground prompt
    bg = set(
        core.add_request(2, tok.encode("c" * 40), SamplingParams(max_tokens=2), background=True)
    )
    for _ in range(3):
        core.step()
    assert [background_tokens(b, bg) for b in runner.batches[1:]] == [6, 6, 6]
    run_to_end(core)
    beside = [b for b in runner.batches if any(c.seq_id in fg for c in b.chunks)]
    assert all(background_tokens(b, bg) <= 6 for b in beside)
    assert [background_tokens(b, bg) for b in beside] == [0, 6, 6, 6, 6, 6]
    # Once the foreground request ended, the rest of the prompt ran in one step.
    assert [background_tokens(b, bg) for b in runner.batches[len(beside) :]] == [10, 1]


def test_a_foreground_prompt_runs_alone_and_background_work_resumes_after_it():
    core, runner = make_core(budget=32, background_step_tokens=6)
    bg = set(
        core.add_request(0, tok.encode("a" * 12), SamplingParams(max_tokens=8), background=True)
    )
    core.step()  # the background prompt's first chunk
    fg = set(core.add_request(1, tok.encode("b" * 10), SamplingParams(max_tokens=3)))
    core.step()
    assert {c.seq_id for c in runner.batches[-1].chunks} == fg  # the prompt alone
    core.step()  # the foreground decodes; the background prompt goes on beside it
    assert {c.seq_id for c in runner.batches[-1].chunks} == fg | bg
    run_to_end(core)


def test_a_waiting_foreground_request_takes_a_background_slot():
    core, runner = make_core(max_num_seqs=2)
    bg = core.add_request(0, tok.encode("abc"), SamplingParams(max_tokens=20), background=True)
    bg += core.add_request(1, tok.encode("abd"), SamplingParams(max_tokens=20), background=True)
    for _ in range(3):
        core.step()
    (fg,) = core.add_request(2, tok.encode("xyz"), SamplingParams(max_tokens=2))
    core.step()
    assert [c.seq_id for c in runner.batches[-1].chunks] == [fg]
    assert core.stats().num_preemptions_total == 1
    assert {s.seq_id for s in core.scheduler.running} == {fg, bg[0]}


def test_a_foreground_request_short_of_blocks_preempts_background_ones():
    core, runner = make_core(num_blocks=6, budget=64, background_step_tokens=64)
    bg = core.add_request(0, tok.encode("a" * 16), SamplingParams(max_tokens=4), background=True)
    [(_, first)] = core.step()  # its prompt (four of the six blocks) and first token
    (fg,) = core.add_request(1, tok.encode("b" * 12), SamplingParams(max_tokens=2))
    core.step()
    assert [c.seq_id for c in runner.batches[-1].chunks] == [fg]
    assert core.stats().num_preemptions_total == 1
    texts = run_to_end(core)
    assert first.text + texts[bg[0]] == "bcde"  # recomputed, not lost


def test_background_outputs_equal_the_same_requests_alone():
    prompts = [tok.encode(p) for p in ("hello", "abcabcabcabc", "zz", "the quick brown")]
    alone, _ = make_core()
    for i, p in enumerate(prompts):
        alone.add_request(i, p, SamplingParams(max_tokens=10))
    want = run_to_end(alone)
    core, _ = make_core(num_blocks=10, max_num_seqs=3, budget=8)
    for i, p in enumerate(prompts):
        core.add_request(i, p, SamplingParams(max_tokens=10), background=i % 2 == 0)
    got = run_to_end(core)
    assert core.stats().num_preemptions_total > 0
    assert got == want


async def test_waiting_background_choices_never_fill_the_foreground_queue():
    config = EngineConfig(max_num_seqs=1, max_waiting=2)
    engine = Engine(ScriptedRunner(), tok, config, eos_token_ids=[EOS], max_model_len=64)
    prompt, params = tok.encode("abc"), SamplingParams(max_tokens=4)
    async with AsyncExitStack() as stack:
        for _ in range(3):  # one for the free slot, two waiting: the queue is full
            await stack.enter_async_context(engine.generate(prompt, params, background=True))
        with pytest.raises(QueueFullError):
            await stack.enter_async_context(engine.generate(prompt, params, background=True))
        # Foreground requests have the queue to themselves.
        for _ in range(3):
            await stack.enter_async_context(engine.generate(prompt, params))
        with pytest.raises(QueueFullError):
            await stack.enter_async_context(engine.generate(prompt, params))
