"""Reading a KV-event publisher from a test: its replay socket answers with every
batch it still holds, so a test sees all events without racing a subscription."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq


def replay(endpoint: str, start: int = 0, limit_s: float = 10.0) -> list[tuple[int, list[Any]]]:
    """Every batch from seq `start` on, as (seq, [ts, events, rank]). Blocking (run it
    on a thread from async code); raises zmq.Again after `limit_s` without an answer."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(limit_s * 1000))
    sock.connect(endpoint)
    try:
        sock.send_multipart((b"", start.to_bytes(8, "big")))
        out = []
        while True:
            _, seq, payload = sock.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                return out
            out.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    finally:
        sock.close(linger=0)


def replayed_events(endpoint: str) -> list[dict[str, Any]]:
    """Every event the publisher still holds, oldest first."""
    return [event for _, (_, events, _) in replay(endpoint) for event in events]
