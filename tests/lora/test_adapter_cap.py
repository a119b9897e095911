"""`--max-loras` caps the distinct adapters of a step, as vLLM's does: a request
whose adapter would be one too many waits, first in line, while the base model's
requests go on; no later request of any adapter overtakes it, so it starts as
soon as one running adapter's requests have finished, however many more arrive
for the adapters running."""

from __future__ import annotations

from engine_fakes import ByteTokenizer, ScriptedRunner, core_over, drain
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.engine.sampling_params import SamplingParams

PROMPT = ByteTokenizer().encode("abc")


def _core(max_loras: int, max_num_seqs: int = 8):
    runner = ScriptedRunner(num_blocks=256, block_size=4)
    return core_over(runner, budget=64, max_num_seqs=max_num_seqs, max_loras=max_loras), runner


def _adapters_per_step(runner: ScriptedRunner) -> list[set[int]]:
    return [{c.params.lora_id for c in batch.chunks} - {0} for batch in runner.batches]


def _add(core, request: int, lora_id: int, max_tokens: int) -> int:
    [seq] = core.add_request(request, PROMPT, SamplingParams(max_tokens=max_tokens, lora_id=lora_id))
    return seq


def test_a_third_adapter_waits_for_one_of_two_to_finish_while_the_base_model_runs():
    core, runner = _core(max_loras=2)
    first = _add(core, 0, lora_id=1, max_tokens=2)
    _add(core, 1, lora_id=2, max_tokens=6)
    third = _add(core, 2, lora_id=3, max_tokens=2)
    base = _add(core, 3, lora_id=0, max_tokens=2)
    started: dict[int, int] = {}
    finished: dict[int, int] = {}
    step = 0
    while core.has_work():
        for seq_id, delta in core.step():
            started.setdefault(seq_id, step)
            if delta.finish_reason is not None:
                finished[seq_id] = step
        step += 1
    assert started[base] == 0 and started[first] == 0
    assert started[third] == finished[first] + 1  # the first step with room
    assert max(len(a) for a in _adapters_per_step(runner)) == 2


def test_later_requests_of_running_adapters_do_not_overtake_a_held_one():
    core, runner = _core(max_loras=1)
    running = _add(core, 0, lora_id=1, max_tokens=3)
    held = _add(core, 1, lora_id=2, max_tokens=1)
    later = _add(core, 2, lora_id=1, max_tokens=1)  # its adapter runs, but it came after
    base = _add(core, 3, lora_id=0, max_tokens=1)
    order = [seq_id for seq_id, deltas in drain(core).items()]
    first_steps = [{c.seq_id for c in batch.chunks} for batch in runner.batches]
    assert first_steps[0] == {running, base}
    assert order.index(held) < order.index(later)
    assert all(len(a) <= 1 for a in _adapters_per_step(runner))


def test_without_a_cap_every_adapter_runs_at_once():
    core, runner = _core(max_loras=0)
    for request, lora_id in enumerate((1, 2, 3, 4)):
        _add(core, request, lora_id, max_tokens=1)
    drain(core)
    assert _adapters_per_step(runner)[0] == {1, 2, 3, 4}


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 5)), min_size=1, max_size=14
    ),
    max_loras=st.integers(1, 3),
    max_num_seqs=st.integers(1, 6),
)
def test_no_step_serves_more_adapters_than_the_cap_and_every_request_finishes(
    requests, max_loras, max_num_seqs
):
    core, runner = _core(max_loras, max_num_seqs)
    seqs = [_add(core, i, lora_id, n) for i, (lora_id, n) in enumerate(requests)]
    outputs = drain(core, max_steps=500)
    assert set(outputs) == set(seqs)
    assert all(len(a) <= max_loras for a in _adapters_per_step(runner))
