import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluiceway.engine.block_manager import BlockManager, OutOfBlocksError, block_key


def test_allocate_and_free_returns_blocks():
    bm = BlockManager(4, 2)
    blocks = bm.allocate(3)
    assert bm.num_free == 1 and bm.num_used == 3
    with pytest.raises(OutOfBlocksError):
        bm.allocate(2)
    bm.free(blocks)
    assert bm.num_free == 4


def test_double_free_is_detected():
    bm = BlockManager(2, 2)
    (block,) = bm.allocate(1)
    bm.free([block])
    with pytest.raises(AssertionError):
        bm.free([block])


def test_prefix_hit_shares_block_and_survives_first_owner():
    bm = BlockManager(4, 2)
    key = block_key(0, (1, 2))
    (block,) = bm.allocate(1)
    bm.register(block, key)
    assert bm.lookup_prefix([key]) == [block]
    assert bm.ref_count(block) == 2
    bm.free([block])
    assert bm.ref_count(block) == 1
    bm.free([block])
    # Free but still cached: a later identical prefix hits it again.
    assert bm.num_free == 4
    assert bm.lookup_prefix([key, block_key(hash(key), (3, 4))]) == [block]


def test_cached_blocks_are_evicted_when_needed():
    bm = BlockManager(2, 2)
    a, b = bm.allocate(2)
    bm.register(a, block_key(0, (1, 2)))
    bm.free([a, b])
    fresh = bm.allocate(2)
    assert sorted(fresh) == sorted([a, b])
    assert bm.lookup_prefix([block_key(0, (1, 2))]) == []


def test_disabled_prefix_caching_never_hits():
    bm = BlockManager(2, 2, enable_prefix_caching=False)
    (a,) = bm.allocate(1)
    bm.register(a, block_key(0, (1, 2)))
    assert bm.lookup_prefix([block_key(0, (1, 2))]) == []


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "free", "share"]), st.integers(0, 5), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_blocks_never_leak_or_double_free(ops):
    bm = BlockManager(8, 2)
    owners: list[list[int]] = []
    for op, count, token in ops:
        if op == "alloc" and count <= bm.num_free:
            blocks = bm.allocate(count)
            for i, block in enumerate(blocks):
                bm.register(block, block_key(i, (token, token)))
            owners.append(blocks)
        elif op == "share":
            owners.append(bm.lookup_prefix([block_key(0, (token, token))]))
        elif op == "free" and owners:
            bm.free(owners.pop(count % len(owners)))
        held = [b for blocks in owners for b in blocks]
        for block in set(held):
            assert bm.ref_count(block) == held.count(block)
        assert bm.num_used == len(set(held))
    for blocks in owners:
        bm.free(blocks)
    assert bm.num_free == 8
