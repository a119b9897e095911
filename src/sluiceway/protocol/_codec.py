"""Helpers shared by the response types: lenient reading, exact writing."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]


def opt(cls: Any, value: Any) -> Any:
    """`cls.from_dict(value)`, or None for None."""
    return None if value is None else cls.from_dict(value)


def drop_none(d: JSON, *keys: str) -> JSON:
    for key in keys:
        if d.get(key) is None:
            d.pop(key, None)
    return d
