"""vLLM's KV-event wire format, as `vllm-router` decodes it.

One ZMQ message per batch: three frames, the topic, the batch's sequence number
(8 bytes, big-endian) and the msgpack payload. The payload is the batch as a
positional array `[ts, events, data_parallel_rank]` (msgspec `array_like`), each
event a map tagged with its class name under "type" (msgspec `tag=True`), with
the fields of vLLM's BlockStored / BlockRemoved / AllBlocksCleared. Replay
answers carry `(seq, payload)` and end with seq -1 and an empty payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from sluiceway.engine.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

# The cache tier a block lives in. "GPU" is what vLLM sends for the model's own
# KV cache; routers read other tiers (host, disk) as cheaper-to-miss copies, so
# a CPU replica's working cache is reported as this tier too.
MEDIUM = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def event_map(event: KVCacheEvent) -> dict[str, Any]:
    """One event as the tagged map vLLM's msgspec encoder writes."""
    if isinstance(event, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": MEDIUM,
            "lora_name": None,
        }
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(event.block_hashes), "medium": MEDIUM}
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV cache event: {event!r}")


def encode_batch(ts: float, events: Sequence[KVCacheEvent], data_parallel_rank: int = 0) -> bytes:
    """A batch's msgpack payload."""
    return msgpack.packb([ts, [event_map(e) for e in events], data_parallel_rank])


def seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big")
