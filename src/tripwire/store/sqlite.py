"""An idempotency store in SQLite (stdlib ``sqlite3``): survives a process restart.

Several processes may share one database file: the claim is an ``INSERT OR IGNORE`` on the
primary key, which SQLite makes atomic across connections. WAL mode and a busy timeout keep
concurrent writers from failing fast.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from tripwire.store.base import Record

__all__ = ["SQLiteIdempotencyStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tripwire_idempotency (
    operation_id TEXT PRIMARY KEY,
    state TEXT NOT NULL CHECK (state IN ('pending', 'done')),
    payload BLOB,
    created_at REAL NOT NULL
)
"""


class SQLiteIdempotencyStore:
    """Operation records in a SQLite file.

    Args:
        path: the database file (created if missing), or ``":memory:"``.
        busy_timeout_s: how long a write waits for another process's lock.
    """

    __slots__ = ("_conn", "_lock", "path")

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 5.0) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(_SCHEMA)

    def claim(self, operation_id: str) -> Record | None:
        """See :meth:`tripwire.store.base.IdempotencyStore.claim`."""
        with self._lock:
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO tripwire_idempotency (operation_id, state, created_at) "
                "VALUES (?, 'pending', ?)",
                (operation_id, time.time()),
            )
            if cur.rowcount == 1:
                return None
            row = self._conn.execute(
                "SELECT state, payload FROM tripwire_idempotency WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
        if row is None:  # released between the two statements: treat as still claimed
            return Record("pending")
        return Record("done", bytes(row[1])) if row[0] == "done" else Record("pending")

    def complete(self, operation_id: str, payload: bytes) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.complete`."""
        with self._lock:
            self._conn.execute(
                "INSERT INTO tripwire_idempotency (operation_id, state, payload, created_at) "
                "VALUES (?, 'done', ?, ?) ON CONFLICT(operation_id) DO UPDATE SET "
                "state = 'done', payload = excluded.payload",
                (operation_id, payload, time.time()),
            )

    def release(self, operation_id: str) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.release`."""
        with self._lock:
            self._conn.execute(
                "DELETE FROM tripwire_idempotency WHERE operation_id = ? AND state = 'pending'",
                (operation_id,),
            )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
