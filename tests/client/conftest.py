"""Fixtures for the client tests: a fake server on a real socket (client_fakes.py)."""

from __future__ import annotations

import functools

import pytest
import trio
from client_fakes import FakeServer


@pytest.fixture
async def server(nursery: trio.Nursery) -> FakeServer:
    fake = FakeServer()
    listeners = await nursery.start(
        functools.partial(trio.serve_tcp, fake.serve_connection, 0, host="127.0.0.1")
    )
    fake.port = listeners[0].socket.getsockname()[1]
    return fake
