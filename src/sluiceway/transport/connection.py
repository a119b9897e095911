"""quart-trio's HTTP connection, with its nursery made visible to the route handler.

quart-trio runs each HTTP request in a nursery holding two tasks: one reading ASGI
messages (it cancels the nursery when the client disconnects) and one running the
handler and then sending the response. A streaming handler starts its work in
that same nursery (`connection_nursery().start(...)`), so the work outlives the
handler's return, is cancelled on disconnect, and its cancel scopes and engine
context stay within one task (PEP 789: no async generator yields across them).
The connection's ASGI `send` is visible the same way, for writing a streamed
response's chunks straight to the socket (`chunk_socket.py`). The connection is also
where a request begins and ends as a whole, so it names the request
(`x-request-id`) and writes its access line (`access_log.py`).
"""

from __future__ import annotations

from contextvars import ContextVar

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart_trio.asgi import TrioASGIHTTPConnection

from sluiceway.config import AccessLogStyle
from sluiceway.transport import access_log

_nursery: ContextVar[trio.Nursery] = ContextVar("sluiceway_connection_nursery")
_send: ContextVar[ASGISendCallable] = ContextVar("sluiceway_connection_send")


def connection_nursery() -> trio.Nursery:
    """The current HTTP request's connection nursery (only inside a request)."""
    return _nursery.get()


def connection_send() -> ASGISendCallable | None:
    """The current HTTP request's ASGI send, or None outside one of our connections."""
    return _send.get(None)


class SluicewayHTTPConnection(TrioASGIHTTPConnection):
    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        style: AccessLogStyle | None = getattr(self.app, "access_log_style", None)
        exchange = access_log.Exchange.of(self.scope, timed=style is not None)
        try:
            async with trio.open_nursery() as nursery:
                token = _nursery.set(nursery)
                # The direct chunk path needs hypercorn's own send; it writes only body
                # chunks, after the head (with its x-request-id) has gone out.
                send_token = _send.set(send)
                exchange_token = access_log.enter(exchange)
                try:
                    # The child tasks copy the context now, nursery, send and exchange
                    # included.
                    nursery.start_soon(self.handle_messages, nursery, request, receive)
                    nursery.start_soon(self.handle_request, nursery, request, exchange.wrap(send))
                finally:
                    access_log.leave(exchange_token)
                    _send.reset(send_token)
                    _nursery.reset(token)
        except Exception:
            exchange.failed = True
            raise
        finally:
            # Every task of the request has ended here, a stream's included, whether
            # it finished, failed or its client left: the response is over.
            if style is not None:
                access_log.write(style, exchange)
