"""In-process stores: the default ledger and idempotency store, and the test doubles.

Thread-safe (one lock each) and asyncio-safe (no awaits, nothing blocks under the lock).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from tripwire.store.base import Record, Reservation

__all__ = ["MemoryIdempotencyStore", "MemoryLedger"]

_granted = tuple.__new__


class MemoryLedger:
    """Counters in a dict under a lock; shared by a parent run and its in-process sub-agents."""

    __slots__ = ("_counts", "_lock")
    remote = False

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def reserve(self, items: Sequence[tuple[str, int, int | None]]) -> Reservation:
        """See :meth:`tripwire.store.base.Ledger.reserve`."""
        counts = self._counts
        get = counts.get
        with self._lock:
            totals: list[int] = []
            for key, amount, cap in items:
                total = get(key, 0) + amount
                if cap is not None and total > cap:
                    return Reservation(tuple(get(k, 0) for k, _, _ in items), len(totals))
                totals.append(total)
            for (key, _, _), total in zip(items, totals, strict=True):
                counts[key] = total
            # tuple.__new__ skips the named tuple's Python-level __new__: this runs before
            # every tool call (bench_guard).
            return _granted(Reservation, (tuple(totals), None))

    def add(self, items: Sequence[tuple[str, int]]) -> list[int]:
        """See :meth:`tripwire.store.base.Ledger.add`."""
        counts = self._counts
        with self._lock:
            out = []
            for key, amount in items:
                counts[key] = total = counts.get(key, 0) + amount
                out.append(total)
            return out

    def get(self, counters: Sequence[str]) -> list[int]:
        """See :meth:`tripwire.store.base.Ledger.get`."""
        with self._lock:
            return [self._counts.get(k, 0) for k in counters]


class MemoryIdempotencyStore:
    """Operation records in a dict; lives as long as the process."""

    __slots__ = ("_lock", "_records")

    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._lock = threading.Lock()

    def claim(self, operation_id: str) -> Record | None:
        """See :meth:`tripwire.store.base.IdempotencyStore.claim`."""
        with self._lock:
            existing = self._records.get(operation_id)
            if existing is None:
                self._records[operation_id] = Record("pending")
            return existing

    def complete(self, operation_id: str, payload: bytes) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.complete`."""
        with self._lock:
            self._records[operation_id] = Record("done", payload)

    def release(self, operation_id: str) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.release`."""
        with self._lock:
            record = self._records.get(operation_id)
            if record is not None and record.state == "pending":
                del self._records[operation_id]
