"""The prefix cache is keyed by adapter: the same prompt under two adapters, or
under an adapter and the base model, never shares KV blocks; under one adapter it
does, as under the base model."""

from __future__ import annotations

from engine_fakes import ByteTokenizer, ScriptedRunner, core_over, drain

from sluiceway.engine.kv_events import BlockStored
from sluiceway.engine.sampling_params import SamplingParams
from sluiceway.fleet.kv_event_wire import event_map

PROMPT = ByteTokenizer().encode("abcdefghij")  # two full blocks of 4, and 2 tokens


def params(lora_id: int) -> SamplingParams:
    return SamplingParams(max_tokens=2, lora_id=lora_id)


def test_one_prompt_under_three_adapters_at_once_shares_no_block():
    runner = ScriptedRunner(num_blocks=64, block_size=4)
    core = core_over(runner, budget=64)
    for request, lora_id in enumerate((0, 1, 2)):
        core.add_request(request, PROMPT, params(lora_id))
    first = core.scheduler.schedule()
    tables = {w.seq.params.lora_id: w.seq.block_ids for w in first.work}
    assert sorted(tables) == [0, 1, 2]
    blocks = [b for table in tables.values() for b in table]
    assert len(blocks) == len(set(blocks)) == 9
    # Each sequence's whole prompt is computed: none found another's blocks.
    assert [w.num_tokens for w in first.work] == [10, 10, 10]


def test_a_finished_prompt_is_reused_only_under_its_own_adapter():
    runner = ScriptedRunner(num_blocks=64, block_size=4)
    core = core_over(runner, budget=64)
    cached = []
    for request, lora_id in enumerate((0, 1, 2, 1, 0)):
        core.add_request(request, PROMPT, params(lora_id))
        (deltas,) = drain(core).values()
        cached.append(deltas[-1].num_cached_prompt_tokens)
        # The prompt's step names the adapter on every chunk the runner gets.
        assert {c.lora_id for b in runner.batches[-2:] for c in b.chunks} == {lora_id}
    # The base model's blocks serve neither adapter, adapter 1's not adapter 2;
    # a repeat under adapter 1 or the base model finds its own two full blocks.
    assert cached == [0, 0, 0, 8, 8]


def test_stored_blocks_say_their_adapter_and_start_their_own_chain():
    runner = ScriptedRunner(num_blocks=64, block_size=4)
    core = core_over(runner, budget=64)
    events = []
    core.blocks.event_sink = events.append
    for request, lora_id in enumerate((0, 3)):
        core.add_request(request, PROMPT, params(lora_id))
        drain(core)
    stored = [e for e in events if isinstance(e, BlockStored)]
    assert [(e.lora_id, e.token_ids) for e in stored] == [
        (None, tuple(PROMPT[:4])),
        (None, tuple(PROMPT[4:8])),
        (3, tuple(PROMPT[:4])),
        (3, tuple(PROMPT[4:8])),
    ]
    # Each chain's first block has no parent; its second names the first.
    assert [e.parent_block_hash for e in stored] == [
        None,
        stored[0].block_hashes[0],
        None,
        stored[2].block_hashes[0],
    ]
    assert stored[0].block_hashes != stored[2].block_hashes
    # On vLLM's wire, as an LoRA-aware router reads it.
    assert [event_map(e)["lora_id"] for e in stored] == [None, None, 3, 3]
