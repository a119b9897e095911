"""Fair admission: free sequence slots go to the request (group) running the fewest
sequences, so one request with dozens of waiting choices cannot keep a later one
out past the first slot that frees."""

from engine_fakes import EOS, ByteTokenizer, ScriptedRunner, next_byte
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.engine.core import EngineCore
from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()


def make_core(runner: ScriptedRunner, max_num_seqs: int) -> EngineCore:
    return EngineCore(
        runner,
        tok.decode,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=256,
        eos_token_ids=[EOS],
        max_model_len=256,
    )


def scheduled(runner: ScriptedRunner, step: int) -> set[int]:
    return {c.seq_id for c in runner.batches[step].chunks}


def test_a_later_request_takes_the_first_free_slot() -> None:
    """Request 0 asks for 6 choices with 2 slots; the first of them ends after one
    token. Request 1 arrives after that step: the freed slot is its, not the big
    request's next choice (arrival order would make it wait for all six)."""
    runner = ScriptedRunner(script=lambda c: EOS if c.seq_id == 0 else next_byte(c))
    core = make_core(runner, max_num_seqs=2)
    big = core.add_request(0, tok.encode("big"), SamplingParams(max_tokens=50), n=6)
    core.step()
    assert scheduled(runner, 0) == {big[0], big[1]}
    (later,) = core.add_request(1, tok.encode("later"), SamplingParams(max_tokens=50))
    core.step()
    assert scheduled(runner, 1) == {big[1], later}


def test_the_prompts_of_one_request_share_one_turn() -> None:
    """Two engine requests in one group (a two-prompt client request) count as one:
    while the group's first prompt runs, the slot its second prompt's choice frees
    goes to a request of another group, not to the second prompt's next choice,
    although that one arrived first and its own engine request runs nothing."""
    runner = ScriptedRunner()
    core = make_core(runner, max_num_seqs=2)
    (long,) = core.add_request(0, tok.encode("p1"), SamplingParams(max_tokens=50), group="client")
    short = core.add_request(1, tok.encode("p2"), SamplingParams(max_tokens=1), n=3, group="client")
    core.step()  # the long choice and the first short one, which ends
    assert scheduled(runner, 0) == {long, short[0]}
    (other,) = core.add_request(2, tok.encode("q"), SamplingParams(max_tokens=1))
    core.step()
    assert scheduled(runner, 1) == {long, other}


def test_without_groups_the_order_is_arrival() -> None:
    runner = ScriptedRunner()
    core = make_core(runner, max_num_seqs=2)
    ids = [
        core.add_request(i, tok.encode(f"r{i}"), SamplingParams(max_tokens=1))[0] for i in range(5)
    ]
    for _ in range(3):
        core.step()
    assert [sorted(c.seq_id for c in b.chunks) for b in runner.batches] == [
        ids[0:2],
        ids[2:4],
        ids[4:5],
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 6), min_size=1, max_size=6),
    st.integers(1, 4),
    st.integers(1, 4),
)
def test_requests_arriving_together_share_the_slots_evenly(
    sizes: list[int], max_num_seqs: int, max_tokens: int
) -> None:
    """Requests of any sizes arriving together: every choice runs to its end, no
    slot stays free while a choice waits, and in every step no request runs more
    than one sequence more than any request that still has choices waiting."""
    runner = ScriptedRunner(num_blocks=256)
    core = make_core(runner, max_num_seqs=max_num_seqs)
    request_of: dict[int, int] = {}
    for request_id, n in enumerate(sizes):
        prompt = tok.encode(f"r{request_id}")
        for seq_id in core.add_request(
            request_id, prompt, SamplingParams(max_tokens=max_tokens), n=n
        ):
            request_of[seq_id] = request_id
    finished: set[int] = set()
    for _ in range(1000):
        if not core.has_work():
            break
        for seq_id, delta in core.step():
            if delta.finish_reason is not None:
                finished.add(seq_id)
        running: dict[int, int] = {}
        for c in runner.batches[-1].chunks:
            running[request_of[c.seq_id]] = running.get(request_of[c.seq_id], 0) + 1
        waiting = {request_of[s.seq_id] for s in core.scheduler.waiting}
        if waiting:
            assert sum(running.values()) == max_num_seqs
        for request in waiting:
            assert max(running.values()) <= running.get(request, 0) + 1, (running, waiting)
    assert finished == set(request_of)
