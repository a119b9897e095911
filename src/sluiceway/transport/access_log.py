"""Request ids and the access log: the name of each HTTP exchange and the one line it
leaves behind.

Every response carries `x-request-id`: the client's own `X-Request-Id` when it sends
a usable one (1 to 128 visible ASCII characters; anything else is ignored), else the
response id of a generation request (`chatcmpl-...`, `cmpl-...`: the id its body
carries), else a fresh id. Error log lines about a request name the same id
(`current_request_id`).

With `--access-log logfmt|json`, each request leaves one line on the
`sluiceway.access` logger once its response is over: for a stream, when the stream
ends or the client leaves (`finish=abort`; status 499, nginx's convention, when the
client left before the response began). Off, the per-request cost is the
`Exchange` that carries the id and one check of the style.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import secrets
import sys
import time
from collections.abc import Sized
from contextvars import ContextVar
from typing import Any, Protocol

import attrs
import trio

from sluiceway.config import AccessLogStyle

logger = logging.getLogger("sluiceway.access")

HEADER = b"x-request-id"
_CLIENT_ID = re.compile(rb"[\x21-\x7e]{1,128}")
# A random prefix per process and a counter: unique within the process, almost surely
# across restarts, and cheap enough for every health probe.
_PREFIX = f"req-{secrets.token_hex(4)}-"
_counter = itertools.count(1)

_current: ContextVar[Exchange] = ContextVar("sluiceway_exchange")


def fresh_id() -> str:
    return f"{_PREFIX}{next(_counter):x}"


def client_request_id(headers: Any) -> str | None:
    """The client's `X-Request-Id` from ASGI headers, when it is usable."""
    for name, value in headers:
        if name == HEADER:
            return value.decode("ascii") if _CLIENT_ID.fullmatch(value) else None
    return None


class Usage(Protocol):
    """What the access log reads of a generation request (`generation.RequestRun`)."""

    @property
    def choices(self) -> Sized: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...


@attrs.define(eq=False)
class Exchange:
    """One HTTP request and its response; owned by the request's tasks (one event
    loop). `request_id` stays None until the response needs it or a generation
    route names it; `started` is only read when the access log is on."""

    scope: Any
    request_id: str | None
    started: float = 0.0
    status: int | None = None
    complete: bool = False  # the response's last byte was handed to the server
    failed: bool = False  # an exception escaped the app
    usage: Usage | None = None

    @classmethod
    def of(cls, scope: Any, timed: bool) -> Exchange:
        started = trio.current_time() if timed else 0.0
        return cls(scope, client_request_id(scope["headers"]), started)

    def id(self) -> str:
        if self.request_id is None:
            self.request_id = fresh_id()
        return self.request_id

    def wrap(self, send: Any) -> Any:
        """`send` (ASGI), adding `x-request-id` to the response head and noting the
        status and whether the response was sent to its end."""

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
                headers = [*message["headers"], (HEADER, self.id().encode())]
                message = {**message, "headers": headers}
                await send(message)
            else:
                await send(message)
                if message["type"] == "http.response.body" and not message.get("more_body"):
                    self.complete = True

        return send_with_id

    def fields(self) -> dict[str, Any]:
        """The access log line's fields, in order; None where there is no value."""
        scope = self.scope
        status = self.status
        if status is None:
            status = 500 if self.failed else 499
        # Token counts only for a request that reached the engine.
        usage = self.usage if self.usage is not None and len(self.usage.choices) else None
        client = scope.get("client")
        if client:
            host, port = client[0], client[1]
            address: str | None = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        else:
            address = None
        return {
            "time": _timestamp(time.time()),
            "request_id": self.id(),
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "duration_ms": round((trio.current_time() - self.started) * 1000, 1),
            "prompt_tokens": None if usage is None else usage.prompt_tokens,
            "completion_tokens": None if usage is None else usage.completion_tokens,
            "finish": "done" if self.complete else "abort",
            "client": address,
        }


def _timestamp(seconds: float) -> str:
    whole = int(seconds)
    millis = int((seconds - whole) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def enter(exchange: Exchange) -> Any:
    """Make `exchange` the current one (tasks started from here on inherit it); returns
    the token for `leave`."""
    return _current.set(exchange)


def leave(token: Any) -> None:
    _current.reset(token)


def current_request_id() -> str | None:
    """The current request's id (the one its response carries), or None outside one."""
    exchange = _current.get(None)
    return None if exchange is None else exchange.id()


def note_generation(response_id: str, usage: Usage) -> None:
    """A generation route's response id and token counts: the id becomes the request's
    unless the client named it; the counts are read when the access line is written."""
    exchange = _current.get(None)
    if exchange is None:
        return
    if exchange.request_id is None:
        exchange.request_id = response_id
    exchange.usage = usage


def format_line(style: AccessLogStyle, fields: dict[str, Any]) -> str:
    if style == "json":
        return json.dumps(fields, separators=(",", ":"))
    return " ".join(
        f"{key}={_logfmt_value(value)}" for key, value in fields.items() if value is not None
    )


def _logfmt_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' ="\\') and text.isprintable():
        return text
    return json.dumps(text)


def write(style: AccessLogStyle, exchange: Exchange) -> None:
    """Write `exchange`'s access line (call once its response is over)."""
    if logger.isEnabledFor(logging.INFO):
        logger.info(format_line(style, exchange.fields()))


def install_handler() -> None:
    """Send access lines to stderr as they are, without the root logger's prefix
    (for `sluiceway serve --access-log`)."""
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
