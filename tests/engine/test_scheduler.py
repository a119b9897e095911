from engine_fakes import EOS, ByteTokenizer, ScriptedRunner, core_over, drain
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.engine.sampling_params import SamplingParams

tok = ByteTokenizer()


def make_core(num_blocks=64, block_size=4, max_num_seqs=8, budget=16, prefix=True, **runner_kw):
    runner = ScriptedRunner(num_blocks=num_blocks, block_size=block_size, **runner_kw)
    return core_over(runner, max_num_seqs=max_num_seqs, budget=budget, prefix=prefix), runner


def test_chunked_prefill_respects_the_token_budget():
    core, runner = make_core(budget=5)
    core.add_request(0, tok.encode("a" * 13), SamplingParams(max_tokens=2))
    drain(core)
    assert [b.num_tokens for b in runner.batches] == [5, 5, 3, 1]
    assert [c.sample for c in runner.batches[0].chunks] == [False]


def test_n_choices_share_full_prompt_blocks():
    core, _ = make_core(block_size=4)
    core.add_request(0, tok.encode("abcdefghij"), SamplingParams(max_tokens=1), n=3)
    first = core.scheduler.schedule()
    tables = [w.seq.block_ids for w in first.work]
    # Two full prompt blocks are shared by all three choices; the partial third is not.
    assert tables[0][:2] == tables[1][:2] == tables[2][:2]
    assert len({t[2] for t in tables}) == 3
    assert [w.num_tokens for w in first.work] == [10, 2, 2]


def test_repeated_prompt_hits_the_prefix_cache_after_finishing():
    core, runner = make_core()
    core.add_request(0, tok.encode("abcdefghij"), SamplingParams(max_tokens=2))
    drain(core)
    core.add_request(1, tok.encode("abcdefghij"), SamplingParams(max_tokens=2))
    out = drain(core)
    (deltas,) = out.values()
    assert deltas[-1].num_cached_prompt_tokens == 8
    assert runner.batches[-2].num_tokens == 2


def test_eos_stops_unless_ignored_and_min_tokens_suppresses_it():
    core, runner = make_core(script=lambda c: EOS)
    core.add_request(0, [97], SamplingParams(max_tokens=5))
    core.add_request(1, [97], SamplingParams(max_tokens=3, ignore_eos=True))
    core.add_request(2, [97], SamplingParams(max_tokens=5, min_tokens=2))
    out = drain(core)
    assert [d.finish_reason for d in out[0]] == ["stop"]
    assert [d.finish_reason for d in out[1]] == [None, None, "length"]
    suppressed = [c.suppressed_token_ids for b in runner.batches for c in b.chunks if c.seq_id == 2]
    assert suppressed[:2] == [(EOS,), (EOS,)]


def test_stop_token_id_reports_its_reason():
    core, _ = make_core()
    core.add_request(0, [ord("a")], SamplingParams(max_tokens=10, stop_token_ids=[ord("d")]))
    (deltas,) = drain(core).values()
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == ord("d")
    assert "".join(d.text for d in deltas) == "bc"


def test_tiny_pool_forces_preemption_and_everything_still_finishes():
    core, _ = make_core(num_blocks=6, block_size=2, max_num_seqs=4, budget=8, prefix=False)
    for i in range(4):
        core.add_request(i, tok.encode("ab"), SamplingParams(max_tokens=8))
    out = drain(core)
    assert core.scheduler.num_preemptions > 0
    assert all(len(d) == 8 and d[-1].finish_reason == "length" for d in out.values())
    texts = {"".join(x.text for x in d) for d in out.values()}
    assert texts == {"cdefghij"}
    assert core.blocks.num_free == 6


requests = st.lists(
    # (prompt length, max_tokens, n, aborted, background)
    st.tuples(st.integers(1, 12), st.integers(1, 6), st.integers(1, 3), st.booleans(), st.booleans()),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(
    requests,
    st.integers(4, 10),
    st.integers(1, 4),
    st.integers(2, 12),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_budget_limits_and_block_accounting_hold_under_any_mix(
    reqs, num_blocks, max_seqs, budget, prefix, rnd
):
    core, runner = make_core(
        num_blocks=num_blocks, block_size=2, max_num_seqs=max_seqs, budget=budget, prefix=prefix
    )
    expected = {}
    aborted = set()
    for rid, (plen, max_tokens, n, abort, background) in enumerate(reqs):
        prompt = [ord("a") + (rid + i) % 3 for i in range(plen)]
        try:
            ids = core.add_request(
                rid, prompt, SamplingParams(max_tokens=max_tokens), n=n, background=background
            )
        except Exception:
            continue  # too long for this tiny cache
        for seq_id in ids:
            expected[seq_id] = min(max_tokens, core.max_model_len - plen)
        if abort:
            aborted.add(rid)
    produced: dict[int, int] = {}
    finished = set()
    steps = 0
    while core.has_work():
        if aborted and rnd.random() < 0.3:
            core.abort_request(aborted.pop())
            continue
        for seq_id, delta in core.step():
            produced[seq_id] = delta.num_output_tokens
            if delta.finish_reason:
                finished.add(seq_id)
        batch = runner.batches[-1]
        assert batch.num_tokens <= budget
        assert len(batch.chunks) <= max_seqs
        live = [s for s in core.scheduler.running]
        held = [b for s in live for b in s.block_ids]
        assert core.blocks.num_used == len(set(held))
        for block in set(held):
            assert core.blocks.ref_count(block) == held.count(block)
        steps += 1
        assert steps < 2_000
    assert core.blocks.num_free == num_blocks
    for seq_id in finished:
        assert produced[seq_id] == expected[seq_id]
