"""The store interfaces: a budget ledger and an idempotency store (small ``Protocol``\\ s).

Implementations: :mod:`tripwire.store.memory` (in-process; the default and the test double),
:mod:`tripwire.store.sqlite` (idempotency that survives a restart) and
:mod:`tripwire.store.redis` (shared by several processes or hosts).

Contract for every method: it is called on the agent's thread (or a worker thread for the
async variants of the guard), so it must be quick and must not block for long: remote stores
use short socket timeouts. A store that cannot answer either degrades as it documents
(``fail_open``) or raises :class:`StoreUnavailable` (``fail_closed``); the guard turns the
latter into a :class:`~tripwire.errors.RunStopped` subclass, never lets it reach the agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from tripwire.errors import TripwireError

__all__ = ["IdempotencyStore", "Ledger", "Record", "Reservation", "StoreUnavailable"]

OnUnavailable = Literal["fail_open", "fail_closed"]
"""What a remote store does when its server is unreachable (see ``docs/guard.md``)."""


class StoreUnavailable(TripwireError):
    """A store's backend could not be reached and the store is set to ``fail_closed``.

    Raised by stores only; the guard and the idempotency wrapper convert it into a
    :class:`~tripwire.errors.RunStopped` subclass.
    """

    def __init__(self, store: str, detail: str) -> None:
        self.store = store
        self.detail = detail
        super().__init__(f"{store} is unavailable: {detail}", store=store, detail=detail)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.store, self.detail))


class OutageShareSpent(StoreUnavailable):
    """A ``fail_open`` store is unreachable and this process has spent the share of a capped
    budget it may spend alone (``RedisLedger(outage_share=...)``): the run stops rather than
    let every process spend what is left."""


class Reservation(NamedTuple):
    """What one atomic check-and-add (:meth:`Ledger.reserve`) did.

    A named tuple rather than a frozen dataclass: one is built before every tool call, and a
    tuple is several times cheaper to build. Read it by name.
    """

    totals: tuple[int, ...]
    """Each counter of the reservation, in the order of its items: after the add when it was
    granted, as they are now (unchanged) when it was refused."""
    refused: int | None = None
    """The index of the first item that would have gone over its cap (then nothing was
    added); ``None`` when every item fitted and all were added."""

    @property
    def granted(self) -> bool:
        """True when every counter fitted and all were added."""
        return self.refused is None


@runtime_checkable
class Ledger(Protocol):
    """Integer counters with an atomic check-and-add: the budget shared by several runs.

    Counters are named by the guard (``{run}:scope:tool_calls``…) and start at 0. Cost is
    counted in integer nano-dollars.
    """

    remote: bool
    """True when calls do network I/O (the guard's async variants then use a worker thread)."""

    def reserve(self, items: Sequence[tuple[str, int, int | None]]) -> Reservation:
        """Add each ``(counter, amount, cap)`` unless one would go over its cap; all or nothing.

        Counters must be distinct within one call; ``cap=None`` means no cap.

        Returns:
            A :class:`Reservation`: granted with the totals after the add, or refused at the
            first item that would exceed its cap, with the totals now (nothing was added).
        """
        ...

    def add(self, items: Sequence[tuple[str, int]]) -> list[int]:
        """Add each ``(counter, amount)`` unconditionally; return the totals after."""
        ...

    def get(self, counters: Sequence[str]) -> list[int]:
        """The current value of each counter (0 when never set)."""
        ...


@dataclass(frozen=True, slots=True)
class Record:
    """What an idempotency store holds for one operation id."""

    state: Literal["pending", "done"]
    """``pending``: claimed, the action is running (or crashed); ``done``: ``payload`` is set."""
    payload: bytes | None = None
    """The encoded first result (``done`` only)."""


@runtime_checkable
class IdempotencyStore(Protocol):
    """Remembers, per operation id, that an action ran and what it returned."""

    def claim(self, operation_id: str) -> Record | None:
        """Claim ``operation_id`` atomically: ``None`` if the caller now owns it (run the
        action), else the existing record (do not run it again)."""
        ...

    def complete(self, operation_id: str, payload: bytes) -> None:
        """Store the first result of a claimed operation."""
        ...

    def release(self, operation_id: str) -> None:
        """Drop a claim whose action failed, so that it can be tried again."""
        ...
