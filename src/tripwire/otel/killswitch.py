"""The in-process kill flag: how a verdict reached on a span stops the agent's next step.

The span processor judges a run on the thread that ends a tool span, where it must never
raise. It raises the run's *flag* instead, and the agent runtime asks before its next step::

    import tripwire.otel as tw

    for step in agent_steps():
        tw.check()          # raises LoopDetected if this trace's run was judged stuck,
        step.run()          # BudgetExceeded if it used up a budget

A flag holds one cause: a ``stuck`` loop :class:`~tripwire.core.watch.Assessment` or a
budget :class:`~tripwire.core.budget.Stop`. Precedence on one trace: a loop flag replaces any
flag (the newest loop assessment wins, as before); a budget stop never replaces a loop flag
(a stuck run that also ran out of budget ran out *because* it was stuck, and the loop
diagnosis is the more useful one). Per-tool caps raise *tool flags* instead: they refuse that
tool only, through ``check(tool=...)``, never the run's other steps.

:func:`check` with no argument reads the current span's trace id from the OpenTelemetry
context, so it works anywhere inside the run's spans (a tool function, a framework hook, the
loop itself). Where the instrumentation makes no span current (OpenInference's LangChain tracer
runs tool bodies outside their span), it takes the run of the span that last *started* in this
thread or asyncio task (:func:`note_active_run`, which the span processor calls from
``on_start``); with neither, it checks nothing and warns once. A check is one context read and
one dict lookup.

The registry is thread-safe and bounded: at most ``max_flags`` flags (oldest dropped first)
and each flag expires ``ttl_s`` seconds after it was raised. A flag outlives the run's
per-trace watcher state on purpose: the run's root span may end before the runtime's last
check (``agent.run()`` returned and the caller asks whether it stopped cleanly).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from opentelemetry import trace as trace_api

from tripwire import remote as _remote
from tripwire.core.budget import RunCounters, Stop
from tripwire.core.reasons import StopReason, stop_reason_for
from tripwire.core.watch import Assessment
from tripwire.errors import BudgetExceeded, ConfigError, LoopDetected

__all__ = [
    "DEFAULT_FLAG_TTL_S",
    "DEFAULT_MAX_FLAGS",
    "KILL_FLAGS",
    "KillFlag",
    "KillFlags",
    "active_run",
    "check",
    "clear",
    "note_active_run",
    "trace_id_int",
]

logger = logging.getLogger("tripwire.otel")

_ACTIVE_RUN: Final[contextvars.ContextVar[int | None]] = contextvars.ContextVar(
    "tripwire_active_run", default=None
)
"""The trace of the span that last started in this thread / asyncio task (an int, 16 bytes)."""

_warned_no_run = False


active_run: Final[Callable[[], int | None]] = _ACTIVE_RUN.get
"""``active_run()``: the trace noted by :func:`note_active_run` in this thread or task, if any."""

note_active_run: Final[Callable[[int], object]] = _ACTIVE_RUN.set
"""``note_active_run(trace_id)``: record ``trace_id`` as the run active in this thread (and
asyncio task). The span processor calls it from ``on_start`` (the context variable's own
``set``, bound once: one C call per span); :func:`check` without a trace id falls back on it
when no span is current."""


def _no_run_found() -> None:
    global _warned_no_run
    if _warned_no_run:
        return
    _warned_no_run = True
    message = (
        "tripwire.otel.check() found no current span and no run started in this thread or "
        "task, so it checked nothing: pass check(trace_id=...), or call it inside the run's "
        "spans with tripwire's span processor installed (tripwire.otel.instrument())"
    )
    logger.warning("%s (logged once)", message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)

DEFAULT_MAX_FLAGS: Final = 10_000
"""Flags kept at most; the oldest is dropped first (raised flags are rare: stuck runs only)."""

DEFAULT_FLAG_TTL_S: Final = 3600.0
"""A flag expires this long after it was raised (one hour)."""

MAX_TOOL_FLAGS_PER_TRACE: Final = 256
"""Tool flags kept per trace at most (oldest dropped first)."""


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
    """A raised flag: what raised it (a loop assessment or a budget stop), and when.

    Exactly one of :attr:`assessment` and :attr:`stop` is set. ``KillFlag(trace_id,
    assessment, raised_at)`` still builds a loop flag.
    """

    trace_id: int
    """The trace (run) the flag is for."""
    assessment: Assessment | None
    """The ``stuck`` assessment that raised a loop flag (no raw arguments in it); ``None`` for
    a budget flag."""
    raised_at: float
    """When it was raised, on the registry's clock."""
    stop: Stop | None = None
    """The budget limit that raised a budget flag (``None`` for a loop flag)."""
    counters: RunCounters | None = None
    """What the run had consumed when a budget flag went up (as far as the trace showed)."""

    def __post_init__(self) -> None:
        if (self.assessment is None) == (self.stop is None):
            raise ConfigError(
                "KillFlag", (self.assessment, self.stop), "either an assessment or a stop"
            )

    @property
    def reason(self) -> StopReason:
        """Why the run is stopped: the budget stop's reason, or ``loop_detected`` (or
        ``retry_of_non_retryable``) for a loop flag."""
        if self.stop is not None:
            return self.stop.reason
        a = self.assessment
        assert a is not None
        return stop_reason_for(a.rule)

    @property
    def is_loop(self) -> bool:
        """True for a loop flag, False for a budget flag."""
        return self.assessment is not None

    def exception(self) -> LoopDetected | BudgetExceeded:
        """A fresh exception for this flag: :class:`~tripwire.errors.LoopDetected` carrying
        the assessment's fields, or :class:`~tripwire.errors.BudgetExceeded` carrying the
        stop's ``reason``, ``limit_name``, ``limit``, ``observed`` and the ``counters``."""
        stop = self.stop
        if stop is not None:
            return stop.exception(counters=self.counters)
        assert self.assessment is not None
        return self.assessment.exception()


class KillFlags:
    """A bounded, thread-safe registry of raised kill flags, keyed by trace id.

    Args:
        max_flags: flags kept at most (oldest dropped first).
        ttl_s: seconds after which a raised flag expires (``None`` = never).
        clock: seconds, monotonic (injectable for tests).

    Two kinds of flag: the run's flag (one per trace: a loop or a budget stop; every
    :meth:`check` of the trace raises it) and *tool flags* (a per-tool cap was reached: only
    ``check(tool=that_tool)`` raises it). ``max_flags`` bounds each kind separately (tool
    flags by trace, at most :data:`MAX_TOOL_FLAGS_PER_TRACE` per trace).

    Reads (:meth:`get`, :meth:`check`) take no lock: one ``dict.get`` is atomic under the GIL.
    Writes take a short lock.
    """

    __slots__ = ("_clock", "_flags", "_lock", "_tool_flags", "max_flags", "ttl_s")

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
        self._tool_flags: OrderedDict[int, dict[str, KillFlag]] = OrderedDict()
        self._lock = threading.Lock()

    def raise_flag(
        self,
        trace_id: int | str,
        cause: Assessment | Stop,
        *,
        counters: RunCounters | None = None,
    ) -> KillFlag:
        """Raise the run's flag of ``trace_id`` for a loop ``Assessment`` or a budget ``Stop``.

        A loop assessment replaces whatever flag was up. A budget stop does not replace a loop
        flag: the loop flag stays, and is returned (compare ``flag.stop is stop``).

        Args:
            trace_id: the run's trace id (int or 32 hex).
            cause: the ``stuck`` assessment, or the budget stop.
            counters: for a budget stop, what the run had consumed (travels on the exception).

        Returns:
            The flag in force after the call.
        """
        tid = trace_id_int(trace_id)
        if isinstance(cause, Stop):
            flag = KillFlag(tid, None, self._clock(), cause, counters)
        else:
            flag = KillFlag(tid, cause, self._clock())
        with self._lock:
            flags = self._flags
            if flag.stop is not None:
                current = flags.get(tid)
                if current is not None and current.is_loop and not self._expired(current):
                    return current
            flags.pop(tid, None)
            flags[tid] = flag
            while len(flags) > self.max_flags:
                flags.popitem(last=False)
        return flag

    def raise_tool_flag(
        self,
        trace_id: int | str,
        tool: str,
        stop: Stop,
        *,
        counters: RunCounters | None = None,
    ) -> KillFlag:
        """Raise a tool flag: ``check(trace_id, tool=tool)`` raises, plain ``check()`` does not.

        For a per-tool cap (``tool_caps``, ``default_tool_cap``): the run may go on, but not
        call ``tool`` again.
        """
        tid = trace_id_int(trace_id)
        flag = KillFlag(tid, None, self._clock(), stop, counters)
        with self._lock:
            by_trace = self._tool_flags.pop(tid, None)
            if by_trace is None:
                by_trace = {}
            by_trace.pop(tool, None)
            by_trace[tool] = flag
            while len(by_trace) > MAX_TOOL_FLAGS_PER_TRACE:
                del by_trace[next(iter(by_trace))]
            self._tool_flags[tid] = by_trace
            while len(self._tool_flags) > self.max_flags:
                self._tool_flags.popitem(last=False)
        return flag

    def _expired(self, flag: KillFlag) -> bool:
        return self.ttl_s is not None and self._clock() - flag.raised_at > self.ttl_s

    def get(self, trace_id: int | str, tool: str | None = None) -> KillFlag | None:
        """The flag in force for ``trace_id``, or ``None`` (expired flags read as ``None``).

        With ``tool``, the run's flag if one is up, else the tool flag of ``tool``.
        """
        tid = trace_id if isinstance(trace_id, int) else trace_id_int(trace_id)
        flag = self._flags.get(tid)
        if flag is not None:
            if not self._expired(flag):
                return flag
            with self._lock:
                if self._flags.get(tid) is flag:
                    del self._flags[tid]
        if tool is None:
            return None
        by_trace = self._tool_flags.get(tid)
        if by_trace is None:
            return None
        flag = by_trace.get(tool)
        if flag is None:
            return None
        if self._expired(flag):
            with self._lock:
                if by_trace.get(tool) is flag:
                    del by_trace[tool]
            return None
        return flag

    def tool_flags(self, trace_id: int | str) -> dict[str, KillFlag]:
        """The tool flags of ``trace_id`` by tool (a copy; expired ones included until read)."""
        return dict(self._tool_flags.get(trace_id_int(trace_id)) or {})

    def check(self, trace_id: int | str | None = None, *, tool: str | None = None) -> None:
        """Raise the run's exception if its flag is up.

        Args:
            trace_id: the run's trace id (int or 32 hex); ``None`` = the trace of the current
                OpenTelemetry span, else the run whose span last started in this thread or
                task; with neither, nothing is checked (warned once).
            tool: the tool about to be called, if the check guards a tool call: then a tool
                flag of that tool (a per-tool cap reached) raises too.

        Raises:
            LoopDetected: the run's flag is a loop flag; the exception carries the fields of
                the assessment that raised it (``rule``, ``tool``, ``hits``, ``window``,
                ``period``, ``call_index``, ``digest``).
            BudgetExceeded: the run's flag (or, with ``tool``, that tool's flag) is a budget
                stop; it carries ``reason``, ``limit_name``, ``limit``, ``observed`` and
                ``counters``.
        """
        if trace_id is None:
            ctx = trace_api.get_current_span().get_span_context()
            if ctx.is_valid:
                trace_id = ctx.trace_id
            else:
                trace_id = _ACTIVE_RUN.get()
                if trace_id is None:
                    _no_run_found()
                    return
        if not self._flags and (tool is None or not self._tool_flags):
            return  # the common case: nothing is flagged anywhere
        flag = self.get(trace_id, tool)
        if flag is not None:
            raise flag.exception()

    def clear(self, trace_id: int | str) -> bool:
        """Lower the flags of ``trace_id`` (the run's and its tool flags); True if one was up.

        E.g. after nudging the model. The span processor does not raise a budget flag of the
        same run again: clearing it lets the run go on (an operator's decision).
        """
        tid = trace_id_int(trace_id)
        with self._lock:
            run = self._flags.pop(tid, None) is not None
            tools = self._tool_flags.pop(tid, None)
            return run or bool(tools)

    def clear_all(self) -> None:
        """Lower every flag."""
        with self._lock:
            self._flags.clear()
            self._tool_flags.clear()

    def __len__(self) -> int:
        """Runs whose run flag is up (tool flags not included)."""
        return len(self._flags)

    def __contains__(self, trace_id: object) -> bool:
        if not isinstance(trace_id, (int, str)):
            return False
        return self.get(trace_id) is not None

    def __repr__(self) -> str:
        return f"<KillFlags up={len(self._flags)} max_flags={self.max_flags} ttl_s={self.ttl_s}>"


KILL_FLAGS: Final = KillFlags()
"""The process-wide registry that processors raise flags in by default."""


def check(trace_id: int | str | None = None, *, tool: str | None = None) -> None:
    """Raise :class:`~tripwire.errors.LoopDetected` or ``BudgetExceeded`` if the run's kill
    flag is up.

    Call it before each agent step or tool call. ``trace_id=None`` means the current span's
    trace (from the OpenTelemetry context), else the run whose span last started in this thread
    or task; with neither it does nothing and warns once. Before a tool
    call, pass ``tool=`` its name so a per-tool cap that was reached refuses it. Cheap: a
    context read and a dict lookup.

    With the fleet service's kill channel (:func:`tripwire.remote.connect`, or
    ``TRIPWIRE_REDIS_URL`` / ``TRIPWIRE_URL`` in the environment), the service's flag of the
    run stops it too: the check hands the trace id to the channel, which watches it from then
    on (no network on this path).

    Raises:
        LoopDetected: the run was judged ``stuck``; its fields say which rule, tool and call.
        BudgetExceeded: the run reached a budget limit (or, with ``tool``, that tool's cap);
            ``reason``, ``limit_name``, ``limit`` and ``observed`` say which; or an operator
            killed it (``user_cancelled``).
        ConfigError: the fleet service refused this process's token (see
            :mod:`tripwire.remote`).
    """
    if trace_id is None:
        ctx = trace_api.get_current_span().get_span_context()
        trace_id = ctx.trace_id if ctx.is_valid else _ACTIVE_RUN.get()
        if trace_id is None:
            _no_run_found()
            return
    KILL_FLAGS.check(trace_id, tool=tool)
    remote = _remote.current()
    if remote is not None:
        remote.check(trace_id)  # also watches the trace: the URL channel reads its flag


def clear(trace_id: int | str) -> bool:
    """Lower the kill flag of ``trace_id`` in the process-wide registry; True if one was up."""
    return KILL_FLAGS.clear(trace_id)
