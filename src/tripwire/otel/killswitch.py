"""The in-process kill flag: how a verdict reached on a span stops the agent's next step.

The span processor judges a run on the thread that ends a tool span, where it must never
raise. It raises the run's *flag* instead, and the agent runtime asks before its next step::

    import tripwire.otel as tw

    for step in agent_steps():
        tw.check()          # raises LoopDetected if this trace's run was judged stuck
        step.run()

:func:`check` with no argument reads the current span's trace id from the OpenTelemetry
context, so it works anywhere inside the run's spans (a tool function, a framework hook, the
loop itself). A check is one context read and one dict lookup.

The registry is thread-safe and bounded: at most ``max_flags`` flags (oldest dropped first)
and each flag expires ``ttl_s`` seconds after it was raised. A flag outlives the run's
per-trace watcher state on purpose: the run's root span may end before the runtime's last
check (``agent.run()`` returned and the caller asks whether it stopped cleanly).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace as trace_api

from tripwire.core.reasons import Rule
from tripwire.core.watch import Assessment
from tripwire.errors import ConfigError, LoopDetected

__all__ = [
    "DEFAULT_FLAG_TTL_S",
    "DEFAULT_MAX_FLAGS",
    "KILL_FLAGS",
    "KillFlag",
    "KillFlags",
    "check",
    "clear",
    "trace_id_int",
]

DEFAULT_MAX_FLAGS: Final = 10_000
"""Flags kept at most; the oldest is dropped first (raised flags are rare: stuck runs only)."""

DEFAULT_FLAG_TTL_S: Final = 3600.0
"""A flag expires this long after it was raised (one hour)."""


def trace_id_int(trace_id: int | str) -> int:
    """A trace id as the SDK's integer, from an int or 32 hex characters.

    Raises:
        ConfigError: when ``trace_id`` is neither (a developer mistake, not a run outcome).
    """
    if isinstance(trace_id, int) and not isinstance(trace_id, bool):
        return trace_id
    if isinstance(trace_id, str):
        try:
            return int(trace_id, 16)
        except ValueError:
            pass
    raise ConfigError("trace_id", trace_id, "an int or 32 hex characters")


@dataclass(frozen=True, slots=True)
class KillFlag:
    """A raised flag: the assessment that raised it, and when (registry clock)."""

    trace_id: int
    """The trace (run) the flag is for."""
    assessment: Assessment
    """The ``stuck`` assessment that raised the flag (no raw arguments in it)."""
    raised_at: float
    """When it was raised, on the registry's clock."""

    def exception(self) -> LoopDetected:
        """A fresh :class:`~tripwire.errors.LoopDetected` carrying the assessment's fields."""
        a = self.assessment
        return LoopDetected(
            rule=a.rule if a.rule is not None else Rule.REPETITION,
            tool=a.tool or "?",
            hits=a.hits,
            window=a.window,
            period=a.period or 1,
            call_index=a.call_index,
            digest=a.digest or "",
        )


class KillFlags:
    """A bounded, thread-safe registry of raised kill flags, keyed by trace id.

    Args:
        max_flags: flags kept at most (oldest dropped first).
        ttl_s: seconds after which a raised flag expires (``None`` = never).
        clock: seconds, monotonic (injectable for tests).

    Reads (:meth:`get`, :meth:`check`) take no lock: one ``dict.get`` is atomic under the GIL.
    Writes take a short lock.
    """

    __slots__ = ("_clock", "_flags", "_lock", "max_flags", "ttl_s")

    def __init__(
        self,
        max_flags: int = DEFAULT_MAX_FLAGS,
        ttl_s: float | None = DEFAULT_FLAG_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_flags, bool) or not isinstance(max_flags, int) or max_flags < 1:
            raise ConfigError("max_flags", max_flags, "an integer >= 1")
        if ttl_s is not None and (isinstance(ttl_s, bool) or not ttl_s > 0):
            raise ConfigError("ttl_s", ttl_s, "a number > 0 or None")
        self.max_flags = max_flags
        self.ttl_s = ttl_s
        self._clock = clock
        self._flags: OrderedDict[int, KillFlag] = OrderedDict()
        self._lock = threading.Lock()

    def raise_flag(self, trace_id: int | str, assessment: Assessment) -> KillFlag:
        """Raise (or replace) the flag of ``trace_id`` with ``assessment``."""
        tid = trace_id_int(trace_id)
        flag = KillFlag(tid, assessment, self._clock())
        with self._lock:
            flags = self._flags
            flags.pop(tid, None)
            flags[tid] = flag
            while len(flags) > self.max_flags:
                flags.popitem(last=False)
        return flag

    def get(self, trace_id: int | str) -> KillFlag | None:
        """The flag in force for ``trace_id``, or ``None`` (expired flags read as ``None``)."""
        flag = self._flags.get(trace_id if isinstance(trace_id, int) else trace_id_int(trace_id))
        if flag is None:
            return None
        if self.ttl_s is not None and self._clock() - flag.raised_at > self.ttl_s:
            self.clear(flag.trace_id)
            return None
        return flag

    def check(self, trace_id: int | str | None = None) -> None:
        """Raise the run's :class:`~tripwire.errors.LoopDetected` if its flag is up.

        Args:
            trace_id: the run's trace id (int or 32 hex); ``None`` = the trace of the current
                OpenTelemetry span. Outside any span (no valid context) nothing is checked.

        Raises:
            LoopDetected: the flag of that trace is up; the exception carries the fields of
                the assessment that raised it (``rule``, ``tool``, ``hits``, ``window``,
                ``period``, ``call_index``, ``digest``).
        """
        if trace_id is None:
            ctx = trace_api.get_current_span().get_span_context()
            if not ctx.is_valid:
                return
            trace_id = ctx.trace_id
        if not self._flags:  # the common case: nothing is flagged anywhere
            return
        flag = self.get(trace_id)
        if flag is not None:
            raise flag.exception()

    def clear(self, trace_id: int | str) -> bool:
        """Lower the flag of ``trace_id`` (e.g. after nudging the model); True if one was up."""
        tid = trace_id_int(trace_id)
        with self._lock:
            return self._flags.pop(tid, None) is not None

    def clear_all(self) -> None:
        """Lower every flag."""
        with self._lock:
            self._flags.clear()

    def __len__(self) -> int:
        return len(self._flags)

    def __contains__(self, trace_id: object) -> bool:
        if not isinstance(trace_id, (int, str)):
            return False
        return self.get(trace_id) is not None

    def __repr__(self) -> str:
        return f"<KillFlags up={len(self._flags)} max_flags={self.max_flags} ttl_s={self.ttl_s}>"


KILL_FLAGS: Final = KillFlags()
"""The process-wide registry that processors raise flags in by default."""


def check(trace_id: int | str | None = None) -> None:
    """Raise :class:`~tripwire.errors.LoopDetected` if the run's kill flag is up.

    Call it before each agent step or tool call. ``trace_id=None`` means the current span's
    trace (from the OpenTelemetry context); outside any span it does nothing. Cheap: a context
    read and a dict lookup.

    Raises:
        LoopDetected: the run was judged ``stuck``; its fields say which rule, tool and call.
    """
    KILL_FLAGS.check(trace_id)


def clear(trace_id: int | str) -> bool:
    """Lower the kill flag of ``trace_id`` in the process-wide registry; True if one was up."""
    return KILL_FLAGS.clear(trace_id)
