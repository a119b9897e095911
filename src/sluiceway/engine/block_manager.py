"""Paged KV-cache block accounting with reference counts and prefix caching.

Pure bookkeeping: which block ids are in use, by how many sequences, and which
full blocks hold which token prefix. The KV tensors live in the runner.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import attrs

from sluiceway.engine.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventSink,
    external_hash,
)

# A block's identity in the prefix cache: the hash of everything before it and
# its own tokens. Keeping the tokens in the key makes a lookup exact for the block
# itself; the parent is identified by its hash.
BlockKey = tuple[int, tuple[int, ...]]


class OutOfBlocksError(RuntimeError):
    """Raised when more blocks are requested than are free (a scheduler bug)."""


def block_key(parent_hash: int, tokens: Sequence[int]) -> BlockKey:
    return (parent_hash, tuple(tokens))


def chain_hash(key: BlockKey) -> int:
    return hash(key)


def root_hash(lora_id: int) -> int:
    """The parent hash of a chain's first block: 0 for the base model, a salt of
    its own for each LoRA adapter, so the same tokens under two adapters (or an
    adapter and the base model) never share a key."""
    return 0 if lora_id == 0 else hash(("lora", lora_id))


@attrs.define
class BlockManager:
    """Hands out KV blocks and shares full blocks between identical prefixes.

    Invariants: every block is in exactly one of: in use (ref count > 0), free
    and unhashed (`_free`), or free but holding a cached prefix (`_evictable`,
    least recently used first). `num_free` counts both free kinds, since a cached
    block can be evicted on demand.

    `event_sink`, when set, receives the prefix cache's lifecycle (see
    `kv_events`): a `BlockStored` when a block is registered under a new key, a
    `BlockRemoved` when a cached block is evicted, `AllBlocksCleared` from
    `reset_prefix_cache`. The root of a chain (parent hash `root_hash`) has no
    parent; a block of an adapter's chain carries its `lora_id`.
    """

    num_blocks: int
    block_size: int
    enable_prefix_caching: bool = True
    event_sink: KVEventSink | None = None
    _ref_counts: list[int] = attrs.field(init=False)
    _free: list[int] = attrs.field(init=False)
    _evictable: OrderedDict[int, None] = attrs.field(init=False, factory=OrderedDict)
    _key_of_block: dict[int, BlockKey] = attrs.field(init=False, factory=dict)
    _block_of_key: dict[BlockKey, int] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._ref_counts = [0] * self.num_blocks
        # Pop from the end: low ids first, which keeps tests readable.
        self._free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def allocate(self, count: int) -> list[int]:
        """Take `count` fresh blocks (ref count 1). Raises OutOfBlocksError if short."""
        if count > self.num_free:
            raise OutOfBlocksError(f"need {count} blocks, {self.num_free} free")
        blocks = []
        for _ in range(count):
            if self._free:
                block = self._free.pop()
            else:
                block, _ = self._evictable.popitem(last=False)
                key = self._key_of_block.pop(block)
                del self._block_of_key[key]
                if self.event_sink is not None:
                    self.event_sink(BlockRemoved((external_hash(chain_hash(key)),)))
            self._ref_counts[block] = 1
            blocks.append(block)
        return blocks

    def lookup_prefix(self, keys: Sequence[BlockKey]) -> list[int]:
        """Take a reference on the cached blocks matching the leading `keys`.

        Stops at the first miss. The caller owns the returned references and must
        `free` them like any allocated block.
        """
        hits: list[int] = []
        if not self.enable_prefix_caching:
            return hits
        for key in keys:
            block = self._block_of_key.get(key)
            if block is None:
                break
            if self._ref_counts[block] == 0:
                del self._evictable[block]
            self._ref_counts[block] += 1
            hits.append(block)
        return hits

    def register(self, block_id: int, key: BlockKey, lora_id: int = 0) -> None:
        """Record that `block_id` holds (or, within the current step, will hold) `key`.

        A key already cached by another block keeps its first block.
        """
        if not self.enable_prefix_caching or key in self._block_of_key:
            return
        if block_id in self._key_of_block:
            return
        self._block_of_key[key] = block_id
        self._key_of_block[block_id] = key
        if self.event_sink is not None:
            parent, tokens = key
            self.event_sink(
                BlockStored(
                    (external_hash(chain_hash(key)),),
                    None if parent == root_hash(lora_id) else external_hash(parent),
                    tokens,
                    self.block_size,
                    lora_id or None,
                )
            )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, if no block is in use (True), else change
        nothing (False, as vLLM's reset refuses while requests hold blocks)."""
        if self.num_used:
            return False
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._key_of_block.clear()
        self._block_of_key.clear()
        if self.event_sink is not None:
            self.event_sink(AllBlocksCleared())
        return True

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference on each block; a block nobody uses becomes free again.

        Freed cached blocks are released in reverse so the tail of a prefix is
        evicted before its head.
        """
        for block in reversed(block_ids):
            count = self._ref_counts[block]
            if count <= 0:
                raise AssertionError(f"double free of block {block}")
            self._ref_counts[block] = count - 1
            if count == 1:
                if block in self._key_of_block:
                    self._evictable[block] = None
                else:
                    self._free.append(block)
