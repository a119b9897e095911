"""Who owns a stored object: the stored responses, files and batches a key makes
are that key's alone (its project's, when `--api-key-budgets` gives it one).

A request acts for an `Owner` once its key is checked; without configured keys
it acts for no one (None), which sees every object and makes objects that
belong to no one, as before keys could own anything. A store records an owner
only as an HMAC-SHA256 of its name under a random salt of the store's own (kept
in the SQLite file, so that it outlives a restart): a stolen store file names
no key, and the same key hashes differently in every store. The batch store
records the budgeted key that pays for a batch's lines the same way, so that a
later process finds which configured key it is. Another owner's
object is answered as a missing one (404, never 403), so that no key learns
that an id exists.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
from collections.abc import Mapping

import attrs
from quart import g

from sluiceway.config import KeyBudget


@attrs.frozen
class Owner:
    """An owner by name: `project:NAME` for a key with a project, else `key:KEY`
    (the prefixes keep a key from posing as a project of the same spelling)."""

    name: str = attrs.field(repr=False)  # it may hold a key

    @classmethod
    def of_key(cls, key: str, budgets: Mapping[str, KeyBudget]) -> Owner:
        budget = budgets.get(key)
        if budget is not None and budget.project is not None:
            return cls(f"project:{budget.project}")
        return cls(f"key:{key}")


def current_owner() -> Owner | None:
    """The owner the current request acts for (None: no keys are configured)."""
    return g.get("owner")


@attrs.frozen
class OwnerHash:
    """Hashes owners, and the keys that pay for work, under one store's salt."""

    salt: bytes = attrs.field(repr=False, factory=lambda: os.urandom(32))

    def __call__(self, owner: Owner | None) -> str | None:
        """What the store records for `owner` (None for no one)."""
        if owner is None:
            return None
        return self._hmac(owner.name)

    def payer(self, key: str) -> str:
        """What the store records for the budgeted key that pays for a batch's
        lines. Apart from the owner names, so that a file does not show whether a
        batch's owner is the key that pays for it."""
        return self._hmac(f"payer:{key}")

    def _hmac(self, name: str) -> str:
        return hmac.new(self.salt, name.encode("utf-8"), hashlib.sha256).hexdigest()

    @classmethod
    def kept_in(cls, db: sqlite3.Connection) -> OwnerHash:
        """The hash of the store in `db`, its salt made on the first open and kept
        there (a restart must hash a key as before to find its objects)."""
        db.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL)")
        db.execute("INSERT OR IGNORE INTO meta VALUES ('owner_salt', ?)", (os.urandom(32),))
        row = db.execute("SELECT value FROM meta WHERE name = 'owner_salt'").fetchone()
        return cls(bytes(row[0]))


# SQL that keeps the rows of the owner hash bound twice as `?, ?`: every row when
# it is NULL (no keys configured, or the server's own work), else that owner's.
VISIBLE_TO = "(? IS NULL OR owner = ?)"
