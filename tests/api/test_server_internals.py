"""The private parts of hypercorn, quart-trio and h11 that `sluiceway.transport`
(`tcp_server.py`, `h11_protocol.py`, `connection.py`, `chunk_socket.py`) overrides
or reads still have the shape those modules were written against. pyproject.toml
pins the versions; this fails with the name of what changed, so an upgrade is a
decision, not a surprise."""

from __future__ import annotations

import inspect

import h11
import hypercorn.protocol
import pytest
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask
from quart_trio.asgi import TrioASGIHTTPConnection

# (owner, attribute, parameter names of a callable or None for a plain attribute)
EXPECTED: list[tuple[object, str, tuple[str, ...] | None]] = [
    (hypercorn_run, "TCPServer", None),
    (hypercorn.protocol, "H11Protocol", None),
    (TCPServer, "protocol_send", ("self", "event")),
    (TCPServer, "_close", ("self",)),
    (TCPServer, "_read_data", ("self",)),
    (TCPServer, "_idle_timeout", ("self",)),
    (TrioSingleTask, "restart", ("self", "task_group", "action")),
    (TrioSingleTask, "stop", ("self",)),
    (H11Protocol, "_handle_events", ("self",)),
    (H11Protocol, "_maybe_recycle", ("self",)),
    (H11Protocol, "_close_stream", ("self",)),
    (H11Protocol, "_check_protocol", ("self", "event")),
    (H11Protocol, "_create_stream", ("self", "request")),
    (H11Protocol, "_send_h11_event", ("self", "event")),
    (H11Protocol, "_send_error_response", ("self", "status_code")),
    (H11Protocol, "stream_send", ("self", "event")),
    (HTTPStream, "app_send", ("self", "message")),
    (TrioASGIHTTPConnection, "handle_messages", ("self", "nursery", "request", "receive")),
    (TrioASGIHTTPConnection, "handle_request", ("self", "nursery", "request", "send")),
    (TrioASGIHTTPConnection, "_create_request_from_scope", ("self", "send")),
]


@pytest.mark.parametrize(("owner", "name", "parameters"), EXPECTED, ids=lambda v: getattr(v, "__name__", str(v)))
def test_overridden_internals_keep_their_shape(
    owner: object, name: str, parameters: tuple[str, ...] | None
) -> None:
    where = f"{getattr(owner, '__module__', '')}.{getattr(owner, '__name__', owner)}.{name}"
    assert hasattr(owner, name), f"{where} is gone: review the modules that override it before upgrading"
    if parameters is not None:
        got = tuple(inspect.signature(getattr(owner, name)).parameters)
        assert got == parameters, f"{where} now takes {got}, not {parameters}: review before upgrading"


def test_tcp_server_instance_state_is_where_the_overrides_look() -> None:
    source = inspect.getsource(TCPServer.__init__)
    for attribute in ("self.send_lock", "self.idle_task", "self.stream", "self.protocol"):
        assert attribute in source, f"hypercorn's TCPServer no longer sets {attribute}"
    source = inspect.getsource(H11Protocol.__init__)
    for attribute in ("self.can_read", "self.connection", "self.stream", "self.task_group"):
        assert attribute in source, f"hypercorn's H11Protocol no longer sets {attribute}"


def test_h11_chunk_writer_is_where_chunk_socket_looks() -> None:
    from h11._writers import ChunkedWriter

    connection = h11.Connection(h11.SERVER)
    assert hasattr(connection, "_writer"), "h11.Connection no longer keeps its body writer in _writer"
    assert callable(ChunkedWriter)
