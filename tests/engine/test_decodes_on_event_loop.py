"""Small decodes on the event loop's thread (`EngineConfig.event_loop_decode_max_seqs`),
everything else on the model thread, with the OpenMP team freed on each move."""

import threading

import pytest
import trio
from engine_fakes import ByteTokenizer, ScriptedRunner

from sluiceway.config import EngineConfig
from sluiceway.engine.core import EngineCore
from sluiceway.engine.engine import Engine
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.engine.step_threads import ModelThread

tok = ByteTokenizer()


class _ThreadNotingRunner(ScriptedRunner):
    """Logs each step as ("step", thread, sequences in the batch, tokens in it)."""

    def __init__(self, log: list[tuple]) -> None:
        super().__init__(num_blocks=64, block_size=4)
        self._log = log

    def step(self, batch):
        self._log.append(("step", threading.get_ident(), len(batch.chunks), batch.num_tokens))
        return super().step(batch)


async def _run(log: list[tuple], requests: list[tuple[int, int]], **config) -> None:
    """Serve `requests` ((n, max_tokens) each) one after another."""
    model_thread = ModelThread(name="test-model")

    def release() -> None:
        log.append(("release", threading.get_ident()))

    engine = Engine(
        _ThreadNotingRunner(log),
        tok,
        EngineConfig(**config),
        eos_token_ids=[256],
        max_model_len=128,
        model_thread=model_thread,
        openmp_pool_release=release,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.run)
            for n, max_tokens in requests:
                async with engine.generate(tok.encode("ab"), SamplingParams(max_tokens=max_tokens), n=n) as chans:
                    for channel in chans:
                        assert len([d async for d in channel]) == max_tokens
            nursery.cancel_scope.cancel()
    finally:
        model_thread.stop()


def _model_ident(log: list[tuple]) -> int:
    return log[0][1]  # the first step is a prefill, which never runs on the loop


async def test_by_default_no_step_runs_on_the_event_loop():
    # A step on the loop's thread holds every other request, /health included, for
    # as long as it runs; the default keeps the loop free even for a lone decode.
    log: list[tuple] = []
    await _run(log, [(1, 3), (2, 2)])
    assert [entry[0] for entry in log] == ["step"] * 5  # and never a move to free a team
    assert threading.get_ident() not in {entry[1] for entry in log}


async def test_a_lone_decode_runs_on_the_event_loop_and_more_go_back_to_the_model_thread():
    log: list[tuple] = []
    await _run(log, [(1, 3), (2, 2)], event_loop_decode_max_seqs=1)
    loop, model = threading.get_ident(), _model_ident(log)
    assert model != loop
    assert log == [
        ("step", model, 1, 2),  # the prompt
        ("release", model),  # the model thread frees its team before the loop steps
        ("step", loop, 1, 1),
        ("step", loop, 1, 1),
        ("release", loop),  # two prompts: back to the model thread
        ("step", model, 2, 4),
        ("step", model, 2, 2),  # a decode of two sequences stays there
    ]


async def test_the_limit_sets_how_many_sequences_decode_on_the_loop():
    two: list[tuple] = []
    await _run(two, [(2, 2)], event_loop_decode_max_seqs=2)
    loop, model = threading.get_ident(), _model_ident(two)
    assert two == [("step", model, 2, 4), ("release", model), ("step", loop, 2, 2)]

    never: list[tuple] = []
    await _run(never, [(1, 3)], event_loop_decode_max_seqs=0)
    assert [entry[:2] for entry in never] == [("step", _model_ident(never))] * 3


def test_the_limit_cannot_be_negative():
    with pytest.raises(ValueError):
        EngineConfig(event_loop_decode_max_seqs=-1)


def test_the_core_says_when_the_next_step_only_decodes():
    core = EngineCore(
        ScriptedRunner(num_blocks=64, block_size=4),
        tok.decode,
        max_num_seqs=8,
        max_num_batched_tokens=4,  # a 6-token prompt takes two steps
        eos_token_ids=[256],
        max_model_len=128,
    )
    assert not core.next_step_only_decodes(1)  # nothing to do
    core.add_request(0, tok.encode("abcdef"), SamplingParams(max_tokens=5), 1)
    assert not core.next_step_only_decodes(1)  # waiting
    core.step()
    assert not core.next_step_only_decodes(1)  # running, its prompt half computed
    core.step()
    assert core.next_step_only_decodes(1)
    core.add_request(1, tok.encode("ab"), SamplingParams(max_tokens=5), 1)
    assert not core.next_step_only_decodes(2)  # waiting again
    core.step()
    assert core.next_step_only_decodes(2) and not core.next_step_only_decodes(1)
