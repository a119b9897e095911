"""Every private part of hypercorn, h11 and quart-trio that this package overrides
or reads, in one list, with the versions it was checked against.

`problems()` names each one that is missing or has changed shape, and
`version_problems()` each library whose installed minor version is not the one
checked; `tcp_server.install()` patches nothing while `problems()` has anything
to say (hypercorn's own classes then serve, and the log says why), and
`tests/api/test_server_internals.py` fails on either. Upgrading one of these
libraries means reading the overrides named here against its new source, then
moving `CHECKED_AGAINST`.
"""

from __future__ import annotations

import inspect
from importlib import metadata

import h11
import hypercorn.protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import TrioSingleTask
from quart_trio.asgi import TrioASGIHTTPConnection

# Distribution name -> the major.minor version the overrides were read against
# (pyproject.toml bounds each to it).
CHECKED_AGAINST = {"hypercorn": "0.18", "h11": "0.16", "quart-trio": "0.12"}

# (owner, attribute, parameter names of a callable or None for a plain attribute),
# with the module of ours that relies on it.
SIGNATURES: list[tuple[object, str, tuple[str, ...] | None, str]] = [
    (hypercorn_run, "TCPServer", None, "tcp_server: the name the trio worker builds"),
    (hypercorn.protocol, "H11Protocol", None, "tcp_server: the name ProtocolWrapper builds"),
    (TCPServer, "__init__", ("self", "app", "config", "context", "state", "stream"), "tcp_server"),
    (TCPServer, "protocol_send", ("self", "event"), "tcp_server"),
    (TCPServer, "_close", ("self",), "tcp_server"),
    (TCPServer, "_read_data", ("self",), "tcp_server"),
    (TCPServer, "_idle_timeout", ("self",), "tcp_server"),
    (TrioSingleTask, "restart", ("self", "task_group", "action"), "tcp_server"),
    (TrioSingleTask, "stop", ("self",), "tcp_server"),
    (H11Protocol, "_handle_events", ("self",), "h11_protocol"),
    (H11Protocol, "_maybe_recycle", ("self",), "h11_protocol"),
    (H11Protocol, "_close_stream", ("self",), "h11_protocol"),
    (H11Protocol, "_check_protocol", ("self", "event"), "h11_protocol"),
    (H11Protocol, "_create_stream", ("self", "request"), "h11_protocol"),
    (H11Protocol, "_send_h11_event", ("self", "event"), "h11_protocol"),
    (H11Protocol, "_send_error_response", ("self", "status_code"), "h11_protocol"),
    (H11Protocol, "stream_send", ("self", "event"), "h11_protocol, chunk_socket"),
    (HTTPStream, "app_send", ("self", "message"), "chunk_socket"),
    (TrioASGIHTTPConnection, "handle_messages", ("self", "nursery", "request", "receive"), "connection"),
    (TrioASGIHTTPConnection, "handle_request", ("self", "nursery", "request", "send"), "connection"),
    (TrioASGIHTTPConnection, "_create_request_from_scope", ("self", "send"), "connection"),
]

# Instance attributes our overrides read, as the constructor that sets them.
INSTANCE_ATTRIBUTES: list[tuple[object, tuple[str, ...]]] = [
    (TCPServer, ("send_lock", "idle_task", "stream", "protocol")),
    (H11Protocol, ("can_read", "connection", "stream", "task_group")),
]


def _where(owner: object, name: str) -> str:
    return f"{getattr(owner, '__module__', '')}.{getattr(owner, '__name__', owner)}.{name}"


def problems() -> list[str]:
    """One line for each private part that is gone or changed shape (none: all
    as checked)."""
    found: list[str] = []
    for owner, name, parameters, user in SIGNATURES:
        if not hasattr(owner, name):
            found.append(f"{_where(owner, name)} is gone (used by transport/{user})")
            continue
        if parameters is None:
            continue
        got = tuple(inspect.signature(getattr(owner, name)).parameters)
        if got != parameters:
            found.append(
                f"{_where(owner, name)} now takes {got}, not {parameters} (used by transport/{user})"
            )
    for owner, attributes in INSTANCE_ATTRIBUTES:
        source = inspect.getsource(owner.__init__)  # type: ignore[misc]
        for attribute in attributes:
            if f"self.{attribute}" not in source:
                found.append(f"{_where(owner, '__init__')} no longer sets self.{attribute}")
    connection = h11.Connection(h11.SERVER)
    if not hasattr(connection, "_writer"):
        found.append("h11.Connection no longer keeps its body writer in _writer (chunk_socket)")
    try:
        from h11._writers import ChunkedWriter  # noqa: F401
    except ImportError:
        found.append("h11._writers.ChunkedWriter is gone (chunk_socket)")
    return found


def version_problems() -> list[str]:
    """One line for each library whose installed major.minor is not the one checked."""
    found = []
    for name, checked in CHECKED_AGAINST.items():
        installed = metadata.version(name)
        if ".".join(installed.split(".")[:2]) != checked:
            found.append(f"{name} {installed} is installed; transport/ was checked against {checked}.x")
    return found
