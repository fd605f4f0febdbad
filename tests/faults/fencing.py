"""A fenced resource: the pattern that turns an efficiency lock into a correct one.

A Redis lock cannot stop a holder that was paused (GC, SIGSTOP, a swapped-out
VM) past its lease from waking up and writing after someone else took the
lock. The resource itself must refuse that write. Every grant of a lock name
carries a fencing token (``lock.token``) that is strictly greater than every
earlier grant's; the resource remembers the highest token that wrote each
record and refuses any write carrying a lower one, in the same atomic step as
the write::

    with client.lock(f"invoice:{invoice_id}") as lock:
        invoice = build()
        if not resource.write(f"invoice:{invoice_id}", invoice, token=lock.token):
            raise LockLostError(...)   # a newer holder has written: ours is stale

Here the resource is a SQLite table and the check is one ``UPSERT ... WHERE``;
in PostgreSQL or MySQL it is the same statement, or
``UPDATE ... SET value = %s, fence = %s WHERE id = %s AND fence <= %s``.
Equal tokens are accepted: one holder writes many times under one token.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["FencedResource"]


class FencedResource:
    """Records keyed by name, each remembering the highest fencing token that wrote it."""

    def __init__(self, path: str | Path) -> None:
        # Autocommit: each write is its own atomic statement.
        self._db = sqlite3.connect(path, isolation_level=None, timeout=10)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS records "
            "(key TEXT PRIMARY KEY, value TEXT NOT NULL, fence INTEGER NOT NULL)"
        )

    def write(self, key: str, value: str, *, token: int | None) -> bool:
        """Store ``value`` unless a newer token has written ``key``; True when stored."""
        if token is None:
            raise ValueError("a fenced write needs the lock's token (the lock is not held)")
        cursor = self._db.execute(
            "INSERT INTO records (key, value, fence) VALUES (?, ?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value, fence = excluded.fence "
            "WHERE excluded.fence >= records.fence",
            (key, value, token),
        )
        return cursor.rowcount == 1

    def read(self, key: str) -> tuple[str, int] | None:
        """``(value, fence)`` of ``key``, None when it was never written."""
        row = self._db.execute("SELECT value, fence FROM records WHERE key = ?", (key,)).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def close(self) -> None:
        """Close the database connection."""
        self._db.close()
