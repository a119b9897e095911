"""The block manager reports its prefix cache's lifecycle as vLLM-style KV events."""

from __future__ import annotations

from sluiceway.engine.block_manager import BlockManager, block_key, chain_hash
from sluiceway.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    external_hash,
)


def _manager(num_blocks: int = 2) -> tuple[BlockManager, list[KVCacheEvent]]:
    events: list[KVCacheEvent] = []
    return BlockManager(num_blocks, 2, event_sink=events.append), events


def test_a_registered_block_is_stored_with_its_parent_and_tokens() -> None:
    bm, events = _manager()
    a, b = bm.allocate(2)
    first = block_key(0, (1, 2))
    second = block_key(chain_hash(first), (3, 4))
    bm.register(a, first)
    bm.register(b, second)
    assert events == [
        BlockStored((external_hash(chain_hash(first)),), None, (1, 2), 2),
        BlockStored(
            (external_hash(chain_hash(second)),), external_hash(chain_hash(first)), (3, 4), 2
        ),
    ]
    # Subscribers read unsigned 64-bit hashes.
    assert all(0 <= h < 2**64 for e in events for h in e.block_hashes)  # type: ignore[union-attr]


def test_a_key_already_cached_is_not_stored_twice() -> None:
    bm, events = _manager()
    a, b = bm.allocate(2)
    bm.register(a, block_key(0, (1, 2)))
    bm.register(b, block_key(0, (1, 2)))
    bm.register(a, block_key(0, (5, 6)))
    assert len(events) == 1


def test_freeing_keeps_the_content_and_eviction_removes_it() -> None:
    bm, events = _manager()
    a, b = bm.allocate(2)
    key = block_key(0, (1, 2))
    bm.register(a, key)
    bm.free([a, b])
    assert len(events) == 1  # freed but still cached: nothing removed
    bm.allocate(1)  # takes the unhashed block first
    assert len(events) == 1
    bm.allocate(1)  # now the cached one is evicted
    assert events[1:] == [BlockRemoved((external_hash(chain_hash(key)),))]


def test_reset_clears_only_an_idle_cache() -> None:
    bm, events = _manager()
    (a,) = bm.allocate(1)
    bm.register(a, block_key(0, (1, 2)))
    assert not bm.reset_prefix_cache()
    bm.free([a])
    assert bm.reset_prefix_cache()
    assert events[-1] == AllBlocksCleared()
    assert bm.lookup_prefix([block_key(0, (1, 2))]) == []
    assert bm.num_free == 2


def test_no_events_without_prefix_caching() -> None:
    events: list[KVCacheEvent] = []
    bm = BlockManager(2, 2, enable_prefix_caching=False, event_sink=events.append)
    (a,) = bm.allocate(1)
    bm.register(a, block_key(0, (1, 2)))
    bm.free([a])
    bm.allocate(2)
    assert events == []
