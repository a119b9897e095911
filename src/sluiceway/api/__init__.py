"""The OpenAI-compatible HTTP layer: a quart-trio app on hypercorn's trio worker.

Public names: `create_app` (the app around an engine), `app_state` (its state),
`serve_async` (app + engine loop + drain, inside a nursery), `serve` (load the model
and run until SIGTERM/SIGINT) and `RunningServer` (what `serve_async` hands back).
They are imported on first use, so that importing one submodule of this package
(the fleet reads `ServerState`) does not import the whole server.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sluiceway.api.app import app_state, create_app
    from sluiceway.api.serve import RunningServer, serve, serve_async

__all__ = ["RunningServer", "app_state", "create_app", "serve", "serve_async"]

_HOMES = {
    "app_state": "sluiceway.api.app",
    "create_app": "sluiceway.api.app",
    "RunningServer": "sluiceway.api.serve",
    "serve": "sluiceway.api.serve",
    "serve_async": "sluiceway.api.serve",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sluiceway.api' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
