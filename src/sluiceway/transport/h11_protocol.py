"""hypercorn's HTTP/1.1 protocol, with a connection that outlives its request's cancellation.

hypercorn ends a response inside the task that sent its last bytes: `stream_send`
gets `StreamClosed` and `_maybe_recycle` tells the app the stream is over, then
either readies the connection for the next request (and starts the keep-alive
timer) or closes it. In quart-trio that task is the request's handler, and the
notice ("http.disconnect") makes quart-trio cancel the request's nursery, the
handler's own task included. So the next checkpoint in `_maybe_recycle` raised
`Cancelled` and the rest never ran:

- the keep-alive timer was never restarted, so an idle connection that had
  served anything through quart stayed open forever (only `/health`, answered
  before quart, was reaped);
- a reply sent before the request's body had arrived (a 401, a 404) left the
  connection neither closed nor ready: hypercorn stops reading events once the
  stream is gone, so the body was never consumed, the next request on the
  connection was never parsed, and a client that left saw its socket sit in
  CLOSE-WAIT.

`RecyclingH11Protocol` runs that bookkeeping shielded and, after an early reply,
reads and discards the rest of the body, as nginx does: bounded in size by
`--max-body-size` and in time by `--body-timeout`, after which the connection is
closed; once the body has all arrived the connection serves its next request.
Body bytes that arrive after the app has stopped reading are dropped rather than
queued to it (its queue is bounded, and nobody would ever empty it).
"""

from __future__ import annotations

import h11
import trio
from hypercorn.events import Closed, Event, Updated
from hypercorn.protocol.events import Body, Data, EndBody
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h11 import H11Protocol

from sluiceway.transport import connection_limits

# How long the app gets to take the end-of-stream notice. Its queue is bounded,
# and a shielded wait on it must not be able to hang a connection.
_NOTICE_LIMIT_SECONDS = 1.0


class RecyclingH11Protocol(H11Protocol):
    """`H11Protocol` whose end of a response always leaves the connection either
    ready for its next request (keep-alive timer running), discarding the rest of
    a request body it no longer needs, or closed."""

    _discarding: bool = False
    _discarded_bytes: int = 0
    _discard_over: trio.Event | None = None
    _delivery: trio.CancelScope | None = None

    async def handle(self, event: Event) -> None:
        if isinstance(event, Closed):
            self._end_discard()  # ends the body timer too
        await super().handle(event)

    async def _handle_events(self) -> None:
        # hypercorn's loop, except that a Data/EndOfMessage event with no stream is
        # discarded after an early reply instead of stopping the loop for good,
        # and a body event is delivered under a scope the response's end cancels.
        while True:
            if self.connection.they_are_waiting_for_100_continue:
                await self._send_h11_event(
                    h11.InformationalResponse(
                        status_code=100, headers=self.config.response_headers("h11")
                    )
                )
            try:
                event = self.connection.next_event()
            except h11.RemoteProtocolError as error:
                self._end_discard()
                if self.connection.our_state in {h11.IDLE, h11.SEND_RESPONSE}:
                    await self._send_error_response(error.error_status_hint)
                await self.send(Closed())
                break
            if isinstance(event, h11.Request):
                await self.send(Updated(idle=False))
                await self._check_protocol(event)
                await self._create_stream(event)
            elif event is h11.PAUSED:
                await self.can_read.clear()
                await self.can_read.wait()
            elif isinstance(event, h11.ConnectionClosed) or event is h11.NEED_DATA:
                break
            elif self.stream is None:
                if not (self._discarding and await self._discard(event)):
                    break
            elif isinstance(event, h11.Data):
                await self._deliver(Body(stream_id=1, data=event.data))
            elif isinstance(event, h11.EndOfMessage):
                await self._deliver(EndBody(stream_id=1))
            elif isinstance(event, Data):  # WebSocket pass-through
                await self.stream.handle(event)

    async def _deliver(self, event: StreamEvent) -> None:
        """Hand a request-body event to the app, unless its response ends first."""
        assert self.stream is not None
        with trio.CancelScope() as self._delivery:
            await self.stream.handle(event)
        self._delivery = None

    async def _maybe_recycle(self) -> None:
        """What hypercorn does at the end of a response, shielded from the
        cancellation of the task that sent it (see the module doc)."""
        with trio.CancelScope(shield=True):
            if self._delivery is not None:
                self._delivery.cancel()  # the app takes no more of the body
            with trio.move_on_after(_NOTICE_LIMIT_SECONDS):
                await self._close_stream()
            self.stream = None
            if (
                not self.context.terminated.is_set()
                and isinstance(self.connection, h11.Connection)
                and self.connection.our_state is h11.DONE
                and self.connection.their_state is h11.SEND_BODY
            ):
                self._start_discard()
                await self.can_read.set()
                return
            await self._recycle_or_close()

    async def _recycle_or_close(self) -> None:
        if (
            not self.context.terminated.is_set()
            and self.connection.our_state is h11.DONE
            and self.connection.their_state is h11.DONE
        ):
            try:
                self.connection.start_next_cycle()
            except h11.LocalProtocolError:
                await self.send(Closed())
            else:
                await self.can_read.set()
                await self.send(Updated(idle=True))
        else:
            await self.can_read.set()
            await self.send(Closed())

    def _start_discard(self) -> None:
        """The response went out before the request's body had all arrived: the
        read loop drops the rest (`_discard`), and a timer closes the connection
        if it takes longer than `--body-timeout`."""
        self._discarding = True
        self._discarded_bytes = 0
        self._discard_over = trio.Event()
        self.task_group.spawn(self._close_if_body_is_slow, self._discard_over)

    async def _discard(self, event: object) -> bool:
        """Drop one event of a body nobody reads. True while the read loop should
        go on (more body to come, or the next request)."""
        if isinstance(event, h11.Data):
            self._discarded_bytes += len(event.data)
            if self._discarded_bytes <= connection_limits.of(self.config).max_body_bytes:
                return True
        elif isinstance(event, h11.EndOfMessage):
            self._end_discard()
            await self._recycle_or_close()
            return self.connection.our_state is h11.IDLE
        self._end_discard()
        await self.send(Closed())
        return False

    def _end_discard(self) -> None:
        self._discarding = False
        if self._discard_over is not None:
            self._discard_over.set()
            self._discard_over = None

    async def _close_if_body_is_slow(self, over: trio.Event) -> None:
        with trio.move_on_after(connection_limits.of(self.config).body_timeout):
            await over.wait()
        if not over.is_set():
            with trio.CancelScope(shield=True):
                self._end_discard()
                await self.send(Closed())
