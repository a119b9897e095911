"""The private parts of hypercorn, quart-trio and h11 that `sluiceway.transport`
overrides or reads (listed once, in `transport/internals.py`) still have the shape
those modules were written against, in the versions they were checked against;
when one changes, the server falls back to hypercorn's own classes, loudly, rather
than misbehave; and the overrides apply to our servers only, not to every
hypercorn server in the process."""

from __future__ import annotations

import logging
from typing import Any

import hypercorn.protocol
import pytest
from hypercorn.config import Config as HypercornConfig
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext

from sluiceway.transport import internals, tcp_server
from sluiceway.transport.h11_protocol import RecyclingH11Protocol


def test_every_overridden_internal_keeps_its_shape() -> None:
    assert internals.problems() == []


def test_the_installed_versions_are_the_ones_checked() -> None:
    assert internals.version_problems() == []


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    async def protocol_send(self: Any, event: Any, extra: Any) -> None: ...

    monkeypatch.setattr(TCPServer, "protocol_send", protocol_send)
    (problem,) = internals.problems()
    assert "TCPServer.protocol_send now takes" in problem and "tcp_server" in problem


def test_a_newer_minor_version_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(internals.CHECKED_AGAINST, "h11", "0.99")
    (problem,) = internals.version_problems()
    assert problem.startswith("h11 ") and "0.99.x" in problem


@pytest.fixture
def hypercorn_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """hypercorn's two names as hypercorn ships them, put back after the test."""
    monkeypatch.setattr(hypercorn_run, "TCPServer", TCPServer)
    monkeypatch.setattr(hypercorn.protocol, "H11Protocol", H11Protocol)


def test_changed_internals_leave_hypercorn_serving_and_say_why(
    hypercorn_names: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(internals, "problems", lambda: ["TCPServer._close is gone"])
    with caplog.at_level(logging.ERROR):
        assert tcp_server.install() is False
    assert hypercorn_run.TCPServer is TCPServer
    assert hypercorn.protocol.H11Protocol is H11Protocol
    assert "TCPServer._close is gone" in caplog.text


def _server_for(config: HypercornConfig) -> Any:
    stream: Any = object()  # never read: only the constructor runs
    return hypercorn_run.TCPServer(None, config, WorkerContext(None), {}, stream)  # type: ignore[arg-type]


def test_only_servers_with_a_transport_config_get_our_classes(hypercorn_names: None) -> None:
    assert tcp_server.install() is True
    assert tcp_server.install() is True  # idempotent
    assert type(_server_for(tcp_server.TransportConfig())) is tcp_server.ImmediateSendTCPServer
    assert type(_server_for(HypercornConfig())) is TCPServer


def test_only_connections_of_a_transport_config_get_the_recycling_protocol(
    hypercorn_names: None,
) -> None:
    assert tcp_server.install() is True

    def protocol_for(config: HypercornConfig) -> Any:
        async def send(event: Any) -> None: ...

        return hypercorn.protocol.H11Protocol(
            None,  # type: ignore[arg-type]
            config,
            WorkerContext(None),
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            False,
            None,
            None,
            send,
        )

    assert type(protocol_for(tcp_server.TransportConfig())) is RecyclingH11Protocol
    assert type(protocol_for(HypercornConfig())) is H11Protocol
