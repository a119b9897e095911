"""Stored responses (`store: true`): the response object for
`GET /v1/responses/{id}`, its input items for `GET /v1/responses/{id}/input_items`
and the conversation a later `previous_response_id` continues. Bounded: past
`capacity` responses the least recently used goes first. In memory by default
(`MemoryResponseStore`); in a SQLite file with `--response-store PATH`
(`SqliteResponseStore`), so they outlive a restart.

Each entry records its owner (`owners.py`): every call takes the owner the
request acts for, and another owner's entry is as good as missing. A file from
before owners were recorded opens with its entries owned by no one: visible
only while no keys are configured, since nothing says whose they were."""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import attrs

from sluiceway import protocol
from sluiceway.api.keys.owners import VISIBLE_TO, Owner, OwnerHash
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
    """`owner` None sees every entry and stores one owned by no one (no keys are
    configured); an owner sees only its own."""

    def get(self, response_id: str, *, owner: Owner | None) -> StoredResponse | None:
        """The entry (None: not stored, deleted, evicted, or another owner's); counts
        as a use."""
        ...

    def put(self, entry: StoredResponse, *, owner: Owner | None) -> None:
        """Stores or replaces the entry of `entry.response.id`, owned by `owner`; may
        evict the least recently used one."""
        ...

    def delete(self, response_id: str, *, owner: Owner | None) -> bool:
        """Whether there was an entry of `owner`'s to delete."""
        ...


class MemoryResponseStore:
    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        # Each entry beside its owner's hash (None: no one's).
        self._entries: OrderedDict[str, tuple[str | None, StoredResponse]] = OrderedDict()
        self._hash = OwnerHash()

    def _visible(self, response_id: str, owner: Owner | None) -> StoredResponse | None:
        found = self._entries.get(response_id)
        if found is None or (owner is not None and found[0] != self._hash(owner)):
            return None
        return found[1]

    def get(self, response_id: str, *, owner: Owner | None) -> StoredResponse | None:
        entry = self._visible(response_id, owner)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse, *, owner: Owner | None) -> None:
        self._entries[entry.response.id] = (self._hash(owner), entry)
        self._entries.move_to_end(entry.response.id)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def delete(self, response_id: str, *, owner: Owner | None) -> bool:
        if self._visible(response_id, owner) is None:
            return False
        del self._entries[response_id]
        return True

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
            " input_items TEXT NOT NULL DEFAULT '[]', owner TEXT)"
        )
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(responses)")}
        if "input_items" not in columns:  # a file written before input items were kept
            self._db.execute(
                "ALTER TABLE responses ADD COLUMN input_items TEXT NOT NULL DEFAULT '[]'"
            )
        if "owner" not in columns:  # a file written before owners were recorded
            self._db.execute("ALTER TABLE responses ADD COLUMN owner TEXT")
        self._hash = OwnerHash.kept_in(self._db)
        self._clock = self._db.execute("SELECT COALESCE(MAX(used), 0) FROM responses").fetchone()[0]
        error = ResponseError("server_restarted", "The server restarted.")
        for response_id, text in self._db.execute(
            "SELECT id, response FROM responses WHERE json_extract(response, '$.status') IN (?, ?)",
            _UNFINISHED,
        ).fetchall():
            failed = attrs.evolve(
                protocol.Response.from_dict(json.loads(text)), status="failed", error=error
            )
            self._db.execute(
                "UPDATE responses SET response = ? WHERE id = ?",
                (json.dumps(failed.to_dict()), response_id),
            )

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def get(self, response_id: str, *, owner: Owner | None) -> StoredResponse | None:
        hashed = self._hash(owner)
        row = self._db.execute(
            "SELECT response, conversation, input_items FROM responses"
            f" WHERE id = ? AND {VISIBLE_TO}",
            (response_id, hashed, hashed),
        ).fetchone()
        if row is None:
            return None
        self._db.execute("UPDATE responses SET used = ? WHERE id = ?", (self._tick(), response_id))
        response = protocol.Response.from_dict(json.loads(row[0]))
        return StoredResponse(response, tuple(json.loads(row[1])), tuple(json.loads(row[2])))

    def put(self, entry: StoredResponse, *, owner: Owner | None) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO responses"
            " (id, response, conversation, used, input_items, owner) VALUES (?, ?, ?, ?, ?, ?)",
            (
                entry.response.id,
                json.dumps(entry.response.to_dict()),
                json.dumps(entry.conversation),
                self._tick(),
                json.dumps(entry.input_items),
                self._hash(owner),
            ),
        )
        self._db.execute(
            "DELETE FROM responses WHERE id NOT IN"
            " (SELECT id FROM responses ORDER BY used DESC LIMIT ?)",
            (self.capacity,),
        )

    def delete(self, response_id: str, *, owner: Owner | None) -> bool:
        hashed = self._hash(owner)
        return (
            self._db.execute(
                f"DELETE FROM responses WHERE id = ? AND {VISIBLE_TO}",
                (response_id, hashed, hashed),
            ).rowcount
            > 0
        )

    def __len__(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        self._db.close()
