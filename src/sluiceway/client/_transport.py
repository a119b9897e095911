"""What the resources and streams need of a client: request bodies, deadlines and
sending with retries. `AsyncClient` provides it; naming it here lets those modules
sit below the client instead of importing it back."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

import httpx


class Transport(Protocol):
    def _resolve(self, timeout: Any) -> float | None: ...

    def _body(self, body: Mapping[str, Any], model: str | None) -> dict[str, Any]: ...

    def _deadline(self, timeout: float | None, what: str) -> AbstractContextManager[None]: ...

    async def _request_json(
        self, method: str, path: str, *, json: Any = None, timeout: Any = ...  # noqa: ASYNC109
    ) -> Any: ...

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        stream: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response: ...
