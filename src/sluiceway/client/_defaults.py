"""The 'use the client's setting' marker, shared by every module of the client."""

from __future__ import annotations

from typing import Any


class _Default:
    def __repr__(self) -> str:
        return "DEFAULT"


#: Marker for "use the client's timeout"; pass ``None`` for no deadline at all.
DEFAULT: Any = _Default()
