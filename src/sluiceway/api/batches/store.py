"""Files and batches, in SQLite: uploaded files, each batch, and each of its
lines with its result once it has one. A line's result is written in one
statement, so after a restart every line has either its one result or none (it
runs again); none is lost and none is answered twice. In memory by default;
with `--batch-store PATH` in a file, so that batches resume after a restart.
Each call is one short statement or transaction on the caller's thread (the
event loop's).

Files and batches record their owner (`owners.py`); the calls a request makes
take the owner it acts for and see only that owner's (None: every one). A
batch's output and error files are its owner's. A batch also records the
budgeted key that pays for its lines, hashed as owners are: its owner may be a
project, which names no key to charge. A file from before owners were
recorded opens with its files and batches owned by no one: visible only while
no keys are configured, since nothing says whose they were; its unfinished
batches still resume (unbudgeted, as do those from before payers were
recorded)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import attrs

from sluiceway.api.keys.owners import VISIBLE_TO, Owner, OwnerHash
from sluiceway.protocol.batches import Batch, BatchRequestCounts, FileObject

LineStatus = Literal["pending", "completed", "failed"]
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, filename TEXT NOT NULL,"
    " purpose TEXT NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL, owner TEXT)",
    "CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, created_at INTEGER NOT NULL,"
    " batch TEXT NOT NULL, owner TEXT, payer TEXT)",
    "CREATE TABLE IF NOT EXISTS batch_lines (batch_id TEXT NOT NULL, line INTEGER NOT NULL,"
    " custom_id TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, result TEXT,"
    " PRIMARY KEY (batch_id, line))",
)


@attrs.frozen
class BatchLine:
    """One request of a batch: its 0-based place in the input file, the caller's
    `custom_id`, and the request body as JSON text."""

    line: int
    custom_id: str
    body: str


class BatchStore:
    def __init__(self, path: str | Path = ":memory:") -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None)  # autocommit
        # WAL: a commit is durable once the process has it, without an fsync per line.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in _SCHEMA:
            self._db.execute(statement)
        # A file written before owners, or payers, were recorded.
        for table, column in (("files", "owner"), ("batches", "owner"), ("batches", "payer")):
            columns = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            if column not in columns:
                self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
        self._hash = OwnerHash.kept_in(self._db)

    def close(self) -> None:
        self._db.close()

    # ---- files ----------------------------------------------------------------

    def add_file(
        self, filename: str, purpose: str, content: bytes, *, owner: Owner | None
    ) -> FileObject:
        return self._add_file(filename, purpose, content, self._hash(owner))

    def _add_file(
        self, filename: str, purpose: str, content: bytes, owner_hash: str | None
    ) -> FileObject:
        file = FileObject(
            id=f"file-{uuid.uuid4().hex}",
            bytes=len(content),
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
        )
        self._db.execute(
            "INSERT INTO files (id, filename, purpose, created_at, content, owner)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (file.id, filename, purpose, file.created_at, content, owner_hash),
        )
        return file

    def file(self, file_id: str, *, owner: Owner | None) -> FileObject | None:
        row = self._db.execute(
            "SELECT id, length(content), created_at, filename, purpose FROM files"
            f" WHERE id = ? AND {VISIBLE_TO}",
            (file_id, *self._visible_to(owner)),
        ).fetchone()
        return None if row is None else FileObject(*row)

    def files(self, purpose: str | None = None, *, owner: Owner | None) -> list[FileObject]:
        rows = self._db.execute(
            "SELECT id, length(content), created_at, filename, purpose FROM files"
            f" WHERE (? IS NULL OR purpose = ?) AND {VISIBLE_TO} ORDER BY created_at, rowid",
            (purpose, purpose, *self._visible_to(owner)),
        ).fetchall()
        return [FileObject(*row) for row in rows]

    def file_content(self, file_id: str, *, owner: Owner | None) -> bytes | None:
        row = self._db.execute(
            f"SELECT content FROM files WHERE id = ? AND {VISIBLE_TO}",
            (file_id, *self._visible_to(owner)),
        ).fetchone()
        return None if row is None else bytes(row[0])

    def delete_file(self, file_id: str, *, owner: Owner | None) -> bool:
        deleted = self._db.execute(
            f"DELETE FROM files WHERE id = ? AND {VISIBLE_TO}",
            (file_id, *self._visible_to(owner)),
        )
        return deleted.rowcount > 0

    def _visible_to(self, owner: Owner | None) -> tuple[str | None, str | None]:
        hashed = self._hash(owner)
        return hashed, hashed

    # ---- batches --------------------------------------------------------------

    def add_batch(
        self,
        batch: Batch,
        lines: Sequence[BatchLine],
        *,
        owner: Owner | None,
        payer: str | None,
    ) -> None:
        """Stores a new batch of `owner`'s and its lines (all pending), in one
        transaction; its lines are paid for by the budgeted key `payer` (None:
        no budget), which is recorded only as its hash (`hash_payer`)."""
        payer_hash = None if payer is None else self._hash.payer(payer)
        with self._transaction():
            self._db.execute(
                "INSERT INTO batches (id, created_at, batch, owner, payer) VALUES (?, ?, ?, ?, ?)",
                (
                    batch.id,
                    batch.created_at,
                    json.dumps(batch.to_dict()),
                    self._hash(owner),
                    payer_hash,
                ),
            )
            self._db.executemany(
                "INSERT INTO batch_lines VALUES (?, ?, ?, ?, 'pending', NULL)",
                [(batch.id, ln.line, ln.custom_id, ln.body) for ln in lines],
            )

    def hash_payer(self, key: str) -> str:
        """What this store records for `key` as the payer of a batch."""
        return self._hash.payer(key)

    def batch_payer(self, batch_id: str) -> str | None:
        """The hash recorded for the key that pays for the batch's lines (None:
        none does, or the batch is unknown)."""
        row = self._db.execute("SELECT payer FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else row[0]

    def put_batch(self, batch: Batch) -> None:
        """Replaces a stored batch's state (its counts always come from its lines)."""
        self._db.execute(
            "UPDATE batches SET batch = ? WHERE id = ?", (json.dumps(batch.to_dict()), batch.id)
        )

    def batch(self, batch_id: str, *, owner: Owner | None) -> Batch | None:
        row = self._db.execute(
            f"SELECT batch FROM batches WHERE id = ? AND {VISIBLE_TO}",
            (batch_id, *self._visible_to(owner)),
        ).fetchone()
        if row is None:
            return None
        return attrs.evolve(
            Batch.from_dict(json.loads(row[0])), request_counts=self._counts(batch_id)
        )

    def batches(self, limit: int, after: str | None = None, *, owner: Owner | None) -> list[Batch]:
        """`owner`'s, newest first; `after` an id of theirs: those older than it
        (another owner's id finds none, as an unknown id does)."""
        visible = self._visible_to(owner)
        rows = self._db.execute(
            f"SELECT id FROM batches WHERE {VISIBLE_TO} AND (? IS NULL OR rowid <"
            f" (SELECT rowid FROM batches WHERE id = ? AND {VISIBLE_TO}))"
            " ORDER BY rowid DESC LIMIT ?",
            (*visible, after, after, *visible, limit),
        ).fetchall()
        return [b for (batch_id,) in rows if (b := self.batch(batch_id, owner=None)) is not None]

    def unfinished(self) -> list[str]:
        """The batches a process left running, oldest first."""
        rows = self._db.execute(
            "SELECT id FROM batches WHERE json_extract(batch, '$.status') IN (?, ?, ?, ?)"
            " ORDER BY rowid",
            UNFINISHED,
        ).fetchall()
        return [batch_id for (batch_id,) in rows]

    def pending_lines(self, batch_id: str) -> list[BatchLine]:
        rows = self._db.execute(
            "SELECT line, custom_id, body FROM batch_lines WHERE batch_id = ? AND status = 'pending'"
            " ORDER BY line",
            (batch_id,),
        ).fetchall()
        return [BatchLine(*row) for row in rows]

    def finish_line(self, batch_id: str, line: int, status: LineStatus, result: str) -> None:
        """Records a line's one result; a line already answered keeps its first."""
        self._db.execute(
            "UPDATE batch_lines SET status = ?, result = ? WHERE batch_id = ? AND line = ?"
            " AND status = 'pending'",
            (status, result, batch_id, line),
        )

    def close_batch(self, batch: Batch, output_name: str) -> Batch:
        """Writes the output file (completed lines) and the error file (failed
        lines) of a finished `batch`, its owner's, and stores it with their ids, in
        one transaction, so a restart never finds half of it; returns it as stored."""
        with self._transaction():
            (owner_hash,) = self._db.execute(
                "SELECT owner FROM batches WHERE id = ?", (batch.id,)
            ).fetchone()
            output = self._results_file(
                batch.id, "completed", f"{output_name}_output.jsonl", owner_hash
            )
            errors = self._results_file(
                batch.id, "failed", f"{output_name}_errors.jsonl", owner_hash
            )
            batch = attrs.evolve(batch, output_file_id=output, error_file_id=errors)
            self.put_batch(batch)
        return attrs.evolve(batch, request_counts=self._counts(batch.id))

    def _results_file(
        self, batch_id: str, status: LineStatus, filename: str, owner_hash: str | None
    ) -> str | None:
        """A `batch_output` file of the results of the lines with `status` (JSONL);
        its id, or None when there are none."""
        results = self.results(batch_id, status)
        if not results:
            return None
        content = "".join(r + "\n" for r in results).encode("utf-8")
        return self._add_file(filename, "batch_output", content, owner_hash).id

    def results(self, batch_id: str, status: LineStatus) -> list[str]:
        """The results of the lines with `status`, in input order."""
        rows = self._db.execute(
            "SELECT result FROM batch_lines WHERE batch_id = ? AND status = ? ORDER BY line",
            (batch_id, status),
        ).fetchall()
        return [result for (result,) in rows]

    def _counts(self, batch_id: str) -> BatchRequestCounts:
        total, completed, failed = self._db.execute(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed'),"
            " count(*) FILTER (WHERE status = 'failed') FROM batch_lines WHERE batch_id = ?",
            (batch_id,),
        ).fetchone()
        return BatchRequestCounts(total, completed, failed)

    def _transaction(self) -> sqlite3.Connection:
        # The connection as a context manager commits or rolls back; in autocommit
        # mode it needs the BEGIN itself.
        self._db.execute("BEGIN")
        return self._db
