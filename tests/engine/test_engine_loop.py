"""The trio engine loop with a scripted runner: delivery, aborts, failures."""

import contextlib
import threading

import pytest
import trio
import trio.testing
from engine_fakes import ByteTokenizer, ScriptedRunner

from sluiceway.config import EngineConfig
from sluiceway.engine.engine import Engine
from sluiceway.engine.errors import EngineUnhealthyError, PromptTooLongError, QueueFullError
from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()


def make_engine(runner=None, **config):
    runner = runner or ScriptedRunner(num_blocks=64, block_size=4)
    return Engine(
        runner, tok, EngineConfig(**config), eos_token_ids=[256], max_model_len=128
    ), runner


async def collect(channel):
    deltas = []
    async for delta in channel:
        deltas.append(delta)
    return deltas


async def test_short_choice_finishes_without_waiting_for_long_one(autojump_clock):
    engine, _ = make_engine()
    finished_order = []
    results = {}

    async def consume(name, max_tokens):
        async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=max_tokens)) as (ch,):
            results[name] = await collect(ch)
            finished_order.append((name, engine.stats().num_running_seqs))

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            clients.start_soon(consume, "long", 30)
            clients.start_soon(consume, "short", 2)
        nursery.cancel_scope.cancel()
    # The short one was delivered while the long one was still running.
    assert finished_order[0] == ("short", 1)
    assert "".join(d.text for d in results["short"]) == "cd"
    assert len(results["long"]) == 30 and results["long"][-1].finish_reason == "length"


async def test_n_choices_each_get_their_own_channel(autojump_clock):
    engine, _ = make_engine()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=3), n=3) as channels:
            outs = [await collect(ch) for ch in channels]
        nursery.cancel_scope.cancel()
    assert [len(o) for o in outs] == [3, 3, 3]


async def test_leaving_the_block_aborts_and_frees_blocks(autojump_clock):
    engine, runner = make_engine()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate(tok.encode("abcdef"), SamplingParams(max_tokens=100), n=2) as chs:
            await chs[0].receive()
            assert engine.stats().kv_blocks_used > 0
        await engine.wait_idle()
        stats = engine.stats()
        assert (stats.num_running_seqs, stats.num_waiting_seqs, stats.kv_blocks_used) == (0, 0, 0)
        # The loop stopped decoding the aborted choices (no zombie work).
        steps_after_abort = len(runner.batches)
        await trio.sleep(1)
        assert len(runner.batches) == steps_after_abort
        nursery.cancel_scope.cancel()


async def test_cancelled_consumer_aborts_its_request(autojump_clock):
    engine, _ = make_engine()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        with trio.move_on_after(0.5):
            async with engine.generate([97], SamplingParams(max_tokens=100)) as (ch,):
                await ch.receive()
                await trio.sleep_forever()
        await engine.wait_idle()
        assert engine.stats().kv_blocks_used == 0
        nursery.cancel_scope.cancel()


async def test_request_aborted_while_queued_never_reaches_the_model(autojump_clock):
    engine, runner = make_engine()
    async with engine.generate([97, 98], SamplingParams(max_tokens=5)):
        pass  # the loop is not running yet: the request is still in the inbox
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        await engine.wait_idle()
        nursery.cancel_scope.cancel()
    assert runner.batches == []


async def test_vanished_reader_does_not_disturb_others(autojump_clock):
    engine, _ = make_engine()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=50)) as (silent,):
            silent.close()  # the reader is gone but the block is still open
            async with engine.generate([98], SamplingParams(max_tokens=20)) as (ch,):
                deltas = await collect(ch)
        nursery.cancel_scope.cancel()
    assert len(deltas) == 20


async def test_failing_step_reaches_every_open_request(autojump_clock):
    engine, _ = make_engine(ScriptedRunner(fail_on_step=2))
    results = []

    async def consume(prompt):
        async with engine.generate(prompt, SamplingParams(max_tokens=10)) as (ch,):
            results.append(await collect(ch))

    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with trio.open_nursery() as clients:
            for prompt in ([97], [98], [99]):
                clients.start_soon(consume, prompt)
        assert not engine.healthy
        with pytest.raises(EngineUnhealthyError):
            async with engine.generate([97], SamplingParams()):
                pass
    assert len(results) == 3
    stats = engine.stats()
    assert (stats.num_running_seqs, stats.num_waiting_seqs, stats.kv_blocks_used) == (0, 0, 0)
    assert engine._core.blocks.num_used == 0  # really freed, not only reported
    for deltas in results:
        assert deltas[-1].finish_reason == "error" and "scripted step failure" in deltas[-1].error


async def test_queue_bound_and_prompt_length_are_checked_on_entry():
    # The loop is not running, so every admitted choice stays queued; one of the
    # two fills the free slot, the other waits.
    engine, _ = make_engine(max_num_seqs=1, max_waiting=2)
    async with engine.generate([97], SamplingParams(), n=2):
        with pytest.raises(QueueFullError):
            async with engine.generate([97], SamplingParams(), n=2):
                pass
        async with engine.generate([97], SamplingParams(), n=1):
            pass
    # An empty queue admits even a request larger than the bound.
    idle_engine, _ = make_engine(max_num_seqs=1, max_waiting=2)
    async with idle_engine.generate([97], SamplingParams(), n=5):
        pass
    with pytest.raises(PromptTooLongError):
        async with engine.generate([97] * 128, SamplingParams()):
            pass


async def test_queue_bound_counts_only_choices_beyond_the_free_slots():
    """A burst that the engine has not yet scheduled (an idle engine holds its first
    step for the rest of a burst) is not refused while slots are free for it."""
    engine, _ = make_engine(max_num_seqs=4, max_waiting=1)
    async with contextlib.AsyncExitStack() as admitted:
        for _ in range(5):  # four for the free slots, one waits
            await admitted.enter_async_context(engine.generate([97], SamplingParams()))
        assert engine.stats().num_waiting_seqs == 5
        with pytest.raises(QueueFullError):
            async with engine.generate([97], SamplingParams()):
                pass


async def test_step_runs_in_a_worker_thread_while_the_loop_serves():
    gate = threading.Event()
    runner = ScriptedRunner(gate=gate)
    engine, _ = make_engine(runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=2)) as (ch,):
            # The step is parked in its thread; this task still runs on the event loop.
            await trio.to_thread.run_sync(runner.entered.wait)
            assert engine.stats().num_running_seqs == 1
            with pytest.raises(trio.WouldBlock):
                ch.receive_nowait()
            gate.set()
            assert len(await collect(ch)) == 2
        nursery.cancel_scope.cancel()


async def test_engine_close_refuses_new_work_and_lets_open_work_finish(autojump_clock):
    engine, _ = make_engine()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=5)) as (ch,):
            engine.close()
            with pytest.raises(EngineUnhealthyError):
                async with engine.generate([97], SamplingParams()):
                    pass
            assert len(await collect(ch)) == 5
        nursery.cancel_scope.cancel()


async def test_watchdog_fails_a_hung_step_instead_of_hanging(autojump_clock):
    gate = threading.Event()  # never set while the request waits: the step hangs
    # No burst window: the hung step is the first step, at time 0.
    engine, _ = make_engine(ScriptedRunner(gate=gate), step_timeout=30, burst_window=0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            async with engine.generate([97], SamplingParams(max_tokens=3)) as (ch,):
                deltas = await collect(ch)
            assert trio.current_time() == pytest.approx(30)
    finally:
        gate.set()  # release the abandoned worker thread
    assert deltas[-1].finish_reason == "error" and "watchdog" in deltas[-1].error
    assert not engine.healthy
    assert engine.stats().num_running_seqs == 0 and engine.stats().kv_blocks_used == 0


async def test_stream_interval_joins_tokens_after_the_first(autojump_clock):
    async def run(interval):
        engine, _ = make_engine(stream_interval=interval)
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=8)) as (ch,):
                deltas = await collect(ch)
            nursery.cancel_scope.cancel()
        return deltas

    one_by_one, joined = await run(1), await run(3)
    # The first token at once, then three at a time, and the rest with the finish.
    assert [len(d.token_ids) for d in joined] == [1, 3, 3, 1]
    assert [d.num_output_tokens for d in joined] == [1, 4, 7, 8]
    assert joined[-1].finish_reason == "length"
    assert "".join(d.text for d in joined) == "".join(d.text for d in one_by_one) == "cdefghij"
    assert [t for d in joined for t in d.token_ids] == [t for d in one_by_one for t in d.token_ids]


async def test_stream_interval_hands_over_held_tokens_before_a_failure(autojump_clock):
    engine, _ = make_engine(ScriptedRunner(fail_on_step=3), stream_interval=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=8)) as (ch,):
            deltas = await collect(ch)
        nursery.cancel_scope.cancel()
    # Steps 0-2 made three tokens: the first went out alone, two were held.
    assert [d.token_ids for d in deltas[:2]] == [(99,), (100, 101)]
    assert deltas[-1].finish_reason == "error"
    assert not engine._hold_back


async def test_stream_interval_forgets_held_tokens_of_an_aborted_choice(autojump_clock):
    engine, _ = make_engine(stream_interval=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=50)) as (ch,):
            await ch.receive()  # the first token
            await engine._step_boundary.park()  # the end of a later step: a token is held
            assert engine._hold_back
        await engine.wait_idle()
        assert not engine._hold_back
        nursery.cancel_scope.cancel()


async def test_a_cancelled_engine_stops_after_the_step_in_flight_without_a_watchdog(autojump_clock):
    # No step_timeout: the step in flight cannot be abandoned, so it is waited for.
    release = threading.Event()
    # Decodes on the model thread too: this is about a step that cannot be stopped.
    engine, runner = make_engine(
        ScriptedRunner(wait_before_step={1: release}), event_loop_decode_max_seqs=0
    )
    engine_scope = trio.CancelScope()

    async def run_engine(task_status=trio.TASK_STATUS_IGNORED):
        with engine_scope:
            await engine.run(task_status=task_status)

    async with trio.open_nursery() as nursery:
        await nursery.start(run_engine)
        async with engine.generate([97], SamplingParams(max_tokens=50)) as (ch,):
            first = await ch.receive()
            engine_scope.cancel()  # step 1 is in flight or about to be
            release.set()
            rest = await collect(ch)
    # Step 1 finished and its token was delivered; no step ran after it (before the
    # fix the loop stepped on until all 50 tokens were made).
    assert len(runner.batches) == 2
    assert [len(d.token_ids) for d in [first, *rest]] == [1, 1, 0]
    assert rest[-1].finish_reason == "error" and "stopped" in rest[-1].error


async def test_a_failure_answers_requests_it_never_saw_even_if_their_callers_left(autojump_clock):
    gate = threading.Event()
    engine, runner = make_engine(ScriptedRunner(gate=gate, fail_on_step=0))
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.run)
        async with engine.generate([97], SamplingParams(max_tokens=5)) as (first,):
            assert await trio.to_thread.run_sync(runner.entered.wait, 10)  # step 0 is in flight
            # Submitted while the step runs, then left: its channels are closed and
            # its add and abort wait in the inbox when the step fails.
            async with engine.generate([98], SamplingParams(max_tokens=5)):
                pass
            async with engine.generate([99], SamplingParams(max_tokens=5)) as (waiting,):
                gate.set()
                assert [d.finish_reason for d in await collect(waiting)] == ["error"]
            assert (await collect(first))[-1].finish_reason == "error"
        nursery.cancel_scope.cancel()
    assert not engine.healthy
