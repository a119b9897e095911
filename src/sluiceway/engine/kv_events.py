"""The KV block lifecycle as events: what a router needs to know about this
replica's prefix cache.

Pure data, no I/O: the block manager reports to a `KVEventSink` (any callable);
`sluiceway.fleet.kv_event_publisher` turns the events into vLLM's wire format
and sends them from a thread of its own. The meanings follow vLLM's
`vllm/distributed/kv_events.py`: a block is *stored* once it holds a full,
hashed block of tokens that later requests can reuse; it is *removed* when that
content is evicted; *all cleared* means nothing cached before it survives.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

# Block hashes travel as unsigned 64-bit integers (vLLM's ExternalBlockHash as
# an int); Python's `hash` is signed, so it is taken modulo 2**64.
_U64 = (1 << 64) - 1


def external_hash(chain_hash: int) -> int:
    """A block's chain hash as the unsigned 64-bit integer subscribers expect."""
    return chain_hash & _U64


@attrs.frozen
class BlockStored:
    """Full blocks that now hold reusable content. `parent_block_hash` is the hash of
    the block before the first of them (None: they start a sequence); `token_ids`
    are their tokens, `block_size` per block, in order."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    # The LoRA adapter whose keys and values they hold (None: the base model's).
    lora_id: int | None = None


@attrs.frozen
class BlockRemoved:
    """Blocks whose cached content is gone (evicted for new work)."""

    block_hashes: tuple[int, ...]


@attrs.frozen
class AllBlocksCleared:
    """Nothing reported as stored before this event is cached any more."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared

# Called by the block manager's owner (the engine loop or the model thread, never
# both at once) for every event, in order. It must return at once and never raise.
KVEventSink = Callable[[KVCacheEvent], None]
