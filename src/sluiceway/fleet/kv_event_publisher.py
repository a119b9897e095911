"""Publishes KV-cache events over ZMQ from a thread of its own (vLLM's ZmqEventPublisher
protocol: a PUB socket, and a ROUTER socket that replays recent batches).

The engine's side is `record`: a non-blocking put into a bounded queue, so the
engine never waits on the network. When the queue is full the event is dropped
and counted, and subscribers are then sent `AllBlocksCleared`: a router that
missed an event forgets what it knew and relearns from the events after it, so
it may under-credit this replica's cache but never credits blocks it lacks. The
PUB socket never blocks either: a subscriber that stops reading loses messages
past its high-water mark, and one that is gone costs nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import zmq

from sluiceway.engine.kv_events import AllBlocksCleared, KVCacheEvent
from sluiceway.fleet.kv_event_wire import END_SEQ, encode_batch, seq_bytes
from sluiceway.fleet.kv_events_config import KVEventsConfig

log = logging.getLogger(__name__)

# The sending thread wakes this often when idle, to answer replay requests and
# to notice `close`.
_IDLE_POLL_S = 0.05
# Most events in one batch: keeps a message (and a replay of it) small.
_MAX_BATCH = 1024
_START_LIMIT_S = 10.0


class KVEventPublisher:
    """Sends recorded events as vLLM `KVEventBatch`es. Use: `start()` (binds, may
    raise `zmq.ZMQError`), `record(event)` from the engine, `close()` at shutdown.

    `endpoint` / `replay_endpoint` are the addresses actually bound (a port 0 in
    the config becomes the port chosen), known once `start` returns.
    """

    def __init__(self, config: KVEventsConfig, *, data_parallel_rank: int = 0) -> None:
        self.config = config
        self._rank = data_parallel_rank
        self._queue: queue.Queue[KVCacheEvent] = queue.Queue(maxsize=config.max_queue_size)
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._next_seq = 0
        self._lost = False  # an event was dropped since the last batch went out
        self.dropped = 0  # events dropped because the queue was full
        self.sent_batches = 0
        self.endpoint = ""
        self.replay_endpoint: str | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)

    # ---- the engine's side ---------------------------------------------------------

    def record(self, event: KVCacheEvent) -> None:
        """Queue one event for sending. Never blocks and never raises: with the
        queue full the event is dropped and counted (`dropped`)."""
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1
            self._lost = True

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Bind the sockets (on the sending thread, which alone uses them) and start
        sending. Raises what binding raised (say, the port is taken)."""
        self._thread.start()
        if not self._ready.wait(_START_LIMIT_S):
            raise TimeoutError("the KV event publisher did not start")
        if self._error is not None:
            self._thread.join()
            raise self._error
        log.info("publishing KV events on %s (replay: %s)", self.endpoint, self.replay_endpoint)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (for up to about `timeout` seconds), then close the
        sockets without lingering. Returns within about `timeout` seconds; safe to
        call twice or before `start`."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- the sending thread ------------------------------------------------------

    def _run(self) -> None:
        context: zmq.Context = zmq.Context.instance()
        try:
            pub, replay = self._bind(context)
        except BaseException as exc:  # reported to `start`, which re-raises it
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            self._serve(pub, replay)
        except Exception:
            log.exception("the KV event publisher stopped")
        finally:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)

    def _bind(self, context: zmq.Context) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = context.socket(zmq.PUB)
        pub.set_hwm(self.config.hwm)
        replay = None
        try:
            pub.bind(self.config.endpoint)
            self.endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
            if self.config.replay_endpoint is not None:
                replay = context.socket(zmq.ROUTER)
                replay.bind(self.config.replay_endpoint)
                self.replay_endpoint = replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except BaseException:
            pub.close(linger=0)
            if replay is not None:
                replay.close(linger=0)
            raise
        return pub, replay

    def _serve(self, pub: zmq.Socket, replay: zmq.Socket | None) -> None:
        drain_deadline: float | None = None
        while True:
            if self._stop.is_set():
                drain_deadline = drain_deadline or time.monotonic() + 1.0
                if self._queue.empty() or time.monotonic() > drain_deadline:
                    return
            while replay is not None and replay.poll(0):
                self._answer_replay(replay)
            events = self._take()
            if events:
                self._send(pub, events)

    def _take(self) -> list[KVCacheEvent]:
        """The next batch: waits up to `_IDLE_POLL_S` for a first event, then takes
        what else is queued. After a drop it takes everything queued and ends
        with `AllBlocksCleared`, which is then newer than the dropped event."""
        try:
            events = [self._queue.get(timeout=_IDLE_POLL_S)]
        except queue.Empty:
            events = []
        # Cleared before draining: a drop while draining sets it again and is
        # answered by the next batch's own clear.
        lost, self._lost = self._lost, False
        while lost or len(events) < _MAX_BATCH:
            try:
                events.append(self._queue.get_nowait())
            except queue.Empty:
                break
        if lost:
            events.append(AllBlocksCleared())
        return events

    def _send(self, pub: zmq.Socket, events: list[KVCacheEvent]) -> None:
        seq = self._next_seq
        self._next_seq += 1
        payload = encode_batch(time.time(), events, self._rank)
        frames = (self.config.topic.encode(), seq_bytes(seq), payload)
        try:
            pub.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # past every subscriber's high-water mark: they can replay it
        self._replay_buffer.append((seq, payload))
        self.sent_batches += 1

    def _answer_replay(self, replay: zmq.Socket) -> None:
        """A request is [identity, b"", start seq (8 bytes, big-endian)]; the answer
        is each buffered batch from that seq on, then the end marker."""
        frames = replay.recv_multipart()
        if len(frames) != 3:
            log.warning("ignoring a malformed KV event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._replay_buffer):
            if seq >= first:
                replay.send_multipart((client, b"", seq_bytes(seq), payload))
        replay.send_multipart((client, b"", END_SEQ, b""))
