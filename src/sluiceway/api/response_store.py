"""Stored responses (`store: true`): the response object for
`GET /v1/responses/{id}`, its input items for `GET /v1/responses/{id}/input_items`
and the conversation a later `previous_response_id` continues. Bounded: past
`capacity` responses the least recently used goes first. In memory by default
(`MemoryResponseStore`); in a SQLite file with `--response-store PATH`
(`SqliteResponseStore`), so they outlive a restart."""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import attrs

from sluiceway import protocol
from sluiceway.protocol.responses import ResponseError


@attrs.frozen
class StoredResponse:
    response: protocol.Response
    # The chat messages that produced it and its output as messages: what a
    # continuing request puts before its own input.
    conversation: tuple[dict[str, Any], ...]
    # The request's own input items in their listed wire form (each with its id),
    # not those of the conversation it continues.
    input_items: tuple[dict[str, Any], ...] = ()


class ResponseStore(Protocol):
    def get(self, response_id: str) -> StoredResponse | None:
        """The entry (None: not stored, deleted, or evicted); counts as a use."""
        ...

    def put(self, entry: StoredResponse) -> None:
        """Stores or replaces the entry of `entry.response.id`; may evict the least
        recently used one."""
        ...

    def delete(self, response_id: str) -> bool:
        """Whether there was an entry to delete."""
        ...


class MemoryResponseStore:
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


_UNFINISHED = ("queued", "in_progress")


class SqliteResponseStore:
    """The same store in a SQLite file. Each call is one short statement on the
    caller's thread (the event loop's): rows are a response's JSON, a local file.
    Opening it marks the background responses a previous process left
    unfinished as failed: nothing generates them any more."""

    def __init__(self, path: str | Path, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._db = sqlite3.connect(str(path), isolation_level=None)  # autocommit
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, response TEXT NOT NULL,"
            " conversation TEXT NOT NULL, used INTEGER NOT NULL,"
            " input_items TEXT NOT NULL DEFAULT '[]')"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        if "input_items" not in columns:  # a file written before input items were kept
            self._db.execute(
                "ALTER TABLE responses ADD COLUMN input_items TEXT NOT NULL DEFAULT '[]'"
            )
        self._clock = self._db.execute("SELECT COALESCE(MAX(used), 0) FROM responses").fetchone()[0]
        for response_id, text in self._db.execute(
            "SELECT id, response FROM responses WHERE json_extract(response, '$.status') IN (?, ?)",
            _UNFINISHED,
        ).fetchall():
            entry = self.get(response_id)
            assert entry is not None, text
            error = ResponseError("server_restarted", "The server restarted.")
            self.put(
                attrs.evolve(
                    entry, response=attrs.evolve(entry.response, status="failed", error=error)
                )
            )

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def get(self, response_id: str) -> StoredResponse | None:
        row = self._db.execute(
            "SELECT response, conversation, input_items FROM responses WHERE id = ?",
            (response_id,),
        ).fetchone()
        if row is None:
            return None
        self._db.execute("UPDATE responses SET used = ? WHERE id = ?", (self._tick(), response_id))
        response = protocol.Response.from_dict(json.loads(row[0]))
        return StoredResponse(response, tuple(json.loads(row[1])), tuple(json.loads(row[2])))

    def put(self, entry: StoredResponse) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses (id, response, conversation, used, input_items)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                entry.response.id,
                json.dumps(entry.response.to_dict()),
                json.dumps(entry.conversation),
                self._tick(),
                json.dumps(entry.input_items),
            ),
        )
        self._db.execute(
            "DELETE FROM responses WHERE id NOT IN"
            " (SELECT id FROM responses ORDER BY used DESC LIMIT ?)",
            (self.capacity,),
        )

    def delete(self, response_id: str) -> bool:
        return self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()
