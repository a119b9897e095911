"""What one HTTP connection may cost the server: the bounds that hypercorn has no
setting for, carried to our connection classes on hypercorn's config object.

hypercorn builds its connection objects itself, from its own `Config`; there is
no other way to hand them a per-server setting. `attach` stores one
`ConnectionLimits` there and `of` reads it back (defaults where none is stored).
"""

from __future__ import annotations

import resource
import weakref
from typing import Any

import attrs
import trio

_ATTRIBUTE = "sluiceway_connection_limits"


def default_max_connections() -> int:
    """Connections the process can hold while keeping file descriptors for
    everything else (model files, threads' pipes, the log, the listener): the
    soft RLIMIT_NOFILE less a reserve of a twentieth of it, at least 64."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(1, soft - max(64, soft // 20))


@attrs.define(eq=False)
class ConnectionLimits:
    """`max_body_bytes` and `body_timeout` bound a request body read after an early
    reply; `send_stall_timeout` is how long a send may go without the client
    taking a byte. `cut_sends` ends every send still waiting on a client, now and
    from then on (the end of a drain). `max_connections` open connections at most:
    beyond them a new connection is refused at once (`admit_connection`) instead
    of the process running out of descriptors, when accept fails and every client,
    `/health` included, waits in the listen backlog. Owned by the event loop's
    thread."""

    max_body_bytes: int = 4 << 20
    body_timeout: float = 60.0
    send_stall_timeout: float = 30.0
    max_connections: int = attrs.field(factory=default_max_connections)
    sends_cut: bool = False
    open_connections: int = 0
    _waiting_sends: weakref.WeakSet[trio.CancelScope] = attrs.field(factory=weakref.WeakSet)

    def send_deadline(self) -> float:
        """The deadline for a send that starts waiting on its client now."""
        if self.sends_cut:
            return -float("inf")
        return trio.current_time() + self.send_stall_timeout

    def track(self, scope: trio.CancelScope) -> None:
        """Let `cut_sends` end the send waiting under `scope`."""
        self._waiting_sends.add(scope)

    def admit_connection(self) -> bool:
        """Count a new connection in; False (counting nothing) when it must be
        refused. Each admitted connection calls `release_connection` once."""
        if self.open_connections >= self.max_connections:
            return False
        self.open_connections += 1
        return True

    def release_connection(self) -> None:
        self.open_connections -= 1

    def cut_sends(self) -> None:
        self.sends_cut = True
        for scope in list(self._waiting_sends):
            scope.deadline = -float("inf")


def attach(hypercorn_config: Any, limits: ConnectionLimits) -> None:
    setattr(hypercorn_config, _ATTRIBUTE, limits)


def of(hypercorn_config: Any) -> ConnectionLimits:
    limits = getattr(hypercorn_config, _ATTRIBUTE, None)
    if limits is None:
        limits = ConnectionLimits()
        attach(hypercorn_config, limits)
    return limits
