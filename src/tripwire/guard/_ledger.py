"""The guard's side of the budget ledger: counters by name, plans, and the last totals seen.

Counters live in a :class:`~tripwire.store.base.Ledger` (in-process or Redis), named per run
scope (``{run}:tool_calls``, ``{run}:1:cost_nusd`` for a sub-agent…). Every name is built in
one place, :class:`ScopeKeys`, and every total is read back by that name, never by position.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from tripwire.core.budget import Charge, Limits, plan_tool_calls
from tripwire.store.base import Ledger, Reservation

__all__ = ["MAX_TOOL_NAME", "LedgerView", "PlannedCharge", "ScopeKeys", "ToolPlan", "Usage", "tool_key"]

_MAX_SEEN: Final = 4096
"""How many counters' last totals a view remembers (bounded in count; oldest forgotten first)."""
MAX_TOOL_NAME: Final = 256
"""Longer tool names are counted under a clipped name: the first 64 characters and a digest of
the whole (the same in every process, so a shared ledger agrees), bounding the bytes a run
keeps per tool whatever the names."""


def tool_key(tool: str) -> str:
    """The name a tool is counted under (itself, or clipped when longer than MAX_TOOL_NAME)."""
    if len(tool) <= MAX_TOOL_NAME:
        return tool
    digest = hashlib.blake2b(tool.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{tool[:64]}…#{digest}"


@dataclass(frozen=True, slots=True)
class ScopeKeys:
    """The ledger counters of one run scope, by name: a root run (``{run}:``) or a sub-agent
    (``{run}:1:``, ``{run}:1:2:``). Keys of one run share the ``{run}`` hash tag (Redis
    Cluster)."""

    prefix: str
    """The scope's prefix, e.g. ``{job-42}:`` or ``{job-42}:1:``."""
    tool_calls: str
    """Tool calls allowed to run, all tools together."""
    input_tokens: str
    output_tokens: str
    cost_nusd: str
    """Cost in integer nano-dollars."""
    subagents: str
    """Sub-agents started by the scope and its descendants."""

    @classmethod
    def at(cls, prefix: str) -> ScopeKeys:
        """The counters under ``prefix``."""
        return cls(
            prefix=prefix,
            tool_calls=prefix + "tool_calls",
            input_tokens=prefix + "input_tokens",
            output_tokens=prefix + "output_tokens",
            cost_nusd=prefix + "cost_nusd",
            subagents=prefix + "subagents",
        )

    @classmethod
    def root(cls, run_id: str) -> ScopeKeys:
        """The counters of a root run."""
        return cls.at("{" + run_id + "}:")

    def child(self, number: int) -> ScopeKeys:
        """The counters of this scope's ``number``-th sub-agent."""
        return ScopeKeys.at(f"{self.prefix}{number}:")

    def tool(self, name: str) -> str:
        """The per-tool counter of ``name`` (a long name is clipped: :func:`tool_key`)."""
        return f"{self.prefix}tool:{tool_key(name)}"

    def of(self, charge: Charge) -> str:
        """The counter a budget :class:`~tripwire.core.budget.Charge` adds to."""
        if charge.tool is not None:
            return self.tool(charge.tool)
        return self.prefix + charge.counter

    def usage(self) -> tuple[str, str, str]:
        """The token and cost counters."""
        return (self.input_tokens, self.output_tokens, self.cost_nusd)


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost of one scope, read from the ledger by name."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_nusd: int = 0

    @classmethod
    def read(cls, keys: ScopeKeys, totals: dict[str, int]) -> Usage:
        """The scope's usage from ``totals`` (counter name → value)."""
        return cls(
            input_tokens=totals.get(keys.input_tokens, 0),
            output_tokens=totals.get(keys.output_tokens, 0),
            cost_nusd=totals.get(keys.cost_nusd, 0),
        )


@dataclass(frozen=True, slots=True)
class PlannedCharge:
    """One counter a tool call (or batch) adds to, in one scope of the run's chain."""

    scope: int
    """0 for the run itself, 1 for its parent, ..."""
    charge: Charge
    key: str
    """The ledger counter."""
    advise_at: float | None
    """The count at which the cap's advisory starts (``None``: no cap or no advise level)."""


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """What a tool call (or batch) reserves: every scope's counters, in one reservation."""

    items: tuple[tuple[str, int, int | None], ...]
    """``(counter, amount, cap)`` for :meth:`~tripwire.store.base.Ledger.reserve`."""
    charges: tuple[PlannedCharge, ...]
    """The charge of each item (same order)."""
    capped: bool
    """True when some charge has an advise level: the totals need a look after the reserve."""

    @classmethod
    def build(cls, scopes: Iterable[tuple[ScopeKeys, Limits]], tools: Sequence[str]) -> ToolPlan:
        """The plan of a batch of ``tools`` in a chain of ``(keys, limits)`` scopes."""
        items: list[tuple[str, int, int | None]] = []
        charges: list[PlannedCharge] = []
        for i, (keys, limits) in enumerate(scopes):
            advise = limits.levels.advise
            for charge in plan_tool_calls(limits, tools):
                key = keys.of(charge)
                items.append((key, charge.amount, charge.cap))
                advise_at = None
                if charge.cap is not None and advise is not None:
                    advise_at = min(charge.cap * advise, charge.cap)
                charges.append(PlannedCharge(i, charge, key, advise_at))
        return cls(tuple(items), tuple(charges), any(c.advise_at is not None for c in charges))


class LedgerView:
    """A ledger as the guard uses it: totals by counter name, and the last ones it saw.

    For a remote ledger (``ledger.remote``) the view remembers the last total the ledger
    reported for each counter, so that when the ledger is unreachable (``fail_closed``) the
    stop and the receipt still carry the real counters (:meth:`last`). One view is shared by a
    root guard and its sub-agents; it has its own lock.
    """

    __slots__ = ("_lock", "_seen", "ledger", "remote")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.remote: bool = bool(getattr(ledger, "remote", False))
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def reserve(self, items: Sequence[tuple[str, int, int | None]]) -> Reservation:
        """:meth:`~tripwire.store.base.Ledger.reserve` (may raise ``StoreUnavailable``)."""
        reservation = self.ledger.reserve(items)
        if self.remote:
            self._remember([k for k, _, _ in items], reservation.totals)
        return reservation

    def add(self, items: Sequence[tuple[str, int]]) -> dict[str, int]:
        """:meth:`~tripwire.store.base.Ledger.add`; the totals after, by counter."""
        totals = self.ledger.add(items)
        keys = [k for k, _ in items]
        if self.remote:
            self._remember(keys, totals)
        return dict(zip(keys, totals, strict=True))

    def get(self, keys: Sequence[str]) -> dict[str, int]:
        """The current totals of ``keys``, by counter (may raise ``StoreUnavailable``)."""
        totals = self.ledger.get(keys)
        if self.remote:
            self._remember(keys, totals)
        return dict(zip(keys, totals, strict=True))

    def last(self, keys: Sequence[str]) -> dict[str, int]:
        """The last totals the ledger reported for ``keys`` (0 for counters never seen)."""
        with self._lock:
            return {k: self._seen.get(k, 0) for k in keys}

    def count_locally(self, items: Sequence[tuple[str, int]]) -> None:
        """Add to the remembered totals what ran while the ledger could not be reached."""
        with self._lock:
            seen = self._seen
            for k, amount in items:
                seen[k] = seen.get(k, 0) + amount

    def _remember(self, keys: Sequence[str], totals: Sequence[int]) -> None:
        with self._lock:
            seen = self._seen
            for k, total in zip(keys, totals, strict=True):
                if k not in seen and len(seen) >= _MAX_SEEN:
                    del seen[next(iter(seen))]
                seen[k] = total
