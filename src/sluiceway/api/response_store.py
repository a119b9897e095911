"""Stored responses (`store: true`): the response object for
`GET /v1/responses/{id}` and the conversation a later `previous_response_id`
continues. In memory, bounded: past `capacity` responses the least recently
used goes first."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs

from sluiceway import protocol


@attrs.frozen
class StoredResponse:
    response: protocol.Response
    # The chat messages that produced it and its output as messages: what a
    # continuing request puts before its own input.
    conversation: tuple[dict[str, Any], ...]


class ResponseStore:
    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse) -> None:
        self._entries[entry.response.id] = entry
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
