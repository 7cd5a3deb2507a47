"""Test helpers: build call sequences and clocks the way tenacity's ``make_retry_state`` does.

``make_calls("ABAB")`` turns a pattern into tool calls (one letter, one action), so a test
reads like the sequence it checks. :class:`FakeClock` is a clock that only moves when told to,
for the parts of tripwire that take time as an argument. :func:`deep_sizeof` measures per-run
state, counting every shared object once.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterable, Iterator
from enum import Enum
from typing import Any

from tripwire.core.events import ToolCall

__all__ = ["FakeClock", "deep_sizeof", "make_calls", "symbols"]


def symbols(pattern: str | Iterable[str]) -> list[str]:
    """The symbols of ``pattern``: each non-space character of a string, or the items given.

    ``"A B A B"`` and ``"ABAB"`` give the same four symbols; pass a list for longer names.
    """
    if isinstance(pattern, str):
        return [c for c in pattern if not c.isspace()]
    return list(pattern)


def make_calls(pattern: str | Iterable[str], **fields: Any) -> list[ToolCall]:
    """One :class:`ToolCall` per symbol of ``pattern``; equal symbols are identical actions.

    Symbol ``S`` becomes ``ToolCall(tool=S, arguments={"arg": S}, **fields)``, so equal
    symbols share tool and arguments and different symbols differ in both.

    >>> [c.tool for c in make_calls("A B A")]
    ['A', 'B', 'A']
    """
    return [ToolCall(tool=s, arguments={"arg": s}, **fields) for s in symbols(pattern)]


class FakeClock:
    """A clock that only moves when told to (seconds, as a float).

    Call it (or read :attr:`now`) to get the time; :meth:`advance` moves it forward.
    """

    __slots__ = ("now",)

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        """The current time."""

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        """Move the clock forward by ``seconds`` (must be >= 0); return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock never goes back: advance({seconds!r})")
        self.now += seconds
        return self.now

    def ticks(self, step: float) -> Iterator[float]:
        """An endless sequence of times, ``step`` seconds apart, advancing this clock."""
        while True:
            yield self.now
            self.advance(step)


def deep_sizeof(obj: Any, *, exclude: Iterable[Any] = ()) -> int:
    """Bytes held by ``obj`` and everything it references, each object counted once.

    Objects in ``exclude`` (and what only they reference) are not counted: pass the values the
    state shares with the rest of the process (the policy, interned singletons) to measure what
    one more run costs. Classes, modules, functions, enum members and booleans (process-wide
    singletons) are never counted.
    """
    seen: set[int] = {id(x) for x in exclude}
    total = 0
    stack: list[Any] = [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, _NEVER_COUNTED):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        for name in _slot_names(type(o)):
            value = getattr(o, name, None)
            if value is not None:
                stack.append(value)
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict):
            stack.append(d)
    return total


_NEVER_COUNTED: tuple[type, ...] = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    Enum,
    bool,
)


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(s for s in slots if s not in ("__dict__", "__weakref__"))
    fields = getattr(cls, "__struct_fields__", None)  # msgspec.Struct keeps fields in slots too
    if isinstance(fields, tuple):
        names.extend(f for f in fields if f not in names)
    return names
