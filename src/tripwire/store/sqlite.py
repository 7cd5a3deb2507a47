"""An idempotency store in SQLite (stdlib ``sqlite3``): survives a process restart.

Several processes may share one database file: the claim is an ``INSERT OR IGNORE`` on the
primary key, which SQLite makes atomic across connections. WAL mode and a busy timeout keep
concurrent writers from failing fast.

Any database error (a lock held longer than ``busy_timeout_s``, a read-only or corrupt file, a
full disk) is raised as :class:`~tripwire.store.base.StoreUnavailable`, the documented store
error: the idempotency wrapper then refuses to run an action it cannot claim, and retries the
record of one that already ran (see :mod:`tripwire.idempotency`).
"""

from __future__ import annotations

import contextlib
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tripwire.errors import ConfigError
from tripwire.store.base import Record, StoreUnavailable

__all__ = ["SQLiteIdempotencyStore"]

_T = TypeVar("_T")

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
        busy_timeout_s: how long a write waits for another process's lock before the store
            reports itself unavailable.

    Raises:
        StoreUnavailable: from the constructor and every method, when the database cannot be
            opened, read or written (the message names the file and SQLite's error).
    """

    __slots__ = ("_conn", "_lock", "busy_timeout_s", "path")

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout_s: float = 5.0) -> None:
        if (
            isinstance(busy_timeout_s, bool)
            or not isinstance(busy_timeout_s, (int, float))
            or not math.isfinite(busy_timeout_s)
            or not 0 <= busy_timeout_s <= 3600
        ):
            raise ConfigError("busy_timeout_s", busy_timeout_s, "a number of seconds in [0, 3600]")
        self.path = os.fspath(path)
        self.busy_timeout_s = float(busy_timeout_s)
        self._lock = threading.Lock()
        with self._errors():
            self._conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute(_SCHEMA)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            hint = ""
            if "locked" in str(exc) or "busy" in str(exc):
                hint = (
                    f" (another connection held a lock longer than busy_timeout_s="
                    f"{self.busy_timeout_s:g})"
                )
            raise StoreUnavailable(
                f"SQLite idempotency store {self.path}", f"{type(exc).__name__}: {exc}{hint}"
            ) from exc

    def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._lock, self._errors():
            return fn(self._conn)

    def claim(self, operation_id: str) -> Record | None:
        """See :meth:`tripwire.store.base.IdempotencyStore.claim`."""

        def claim(conn: sqlite3.Connection) -> Any:
            cur = conn.execute(
                "INSERT OR IGNORE INTO tripwire_idempotency (operation_id, state, created_at) "
                "VALUES (?, 'pending', ?)",
                (operation_id, time.time()),
            )
            if cur.rowcount == 1:
                return True
            return conn.execute(
                "SELECT state, payload FROM tripwire_idempotency WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()

        row = self._run(claim)
        if row is True:
            return None
        if row is None:  # released between the two statements: treat as still claimed
            return Record("pending")
        return Record("done", bytes(row[1])) if row[0] == "done" else Record("pending")

    def complete(self, operation_id: str, payload: bytes) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.complete`."""
        self._run(
            lambda conn: conn.execute(
                "INSERT INTO tripwire_idempotency (operation_id, state, payload, created_at) "
                "VALUES (?, 'done', ?, ?) ON CONFLICT(operation_id) DO UPDATE SET "
                "state = 'done', payload = excluded.payload",
                (operation_id, payload, time.time()),
            )
        )

    def release(self, operation_id: str) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.release`."""
        self._run(
            lambda conn: conn.execute(
                "DELETE FROM tripwire_idempotency WHERE operation_id = ? AND state = 'pending'",
                (operation_id,),
            )
        )

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._conn.close()
