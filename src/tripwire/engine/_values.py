"""What the engine takes (mapped span events) and what it gives back (decisions).

Frozen ``msgspec.Struct`` values: one is built per agent span on the agent's path, and a Struct
is built about fifteen times faster than a frozen dataclass, with the same immutability.
"""

from __future__ import annotations

from typing import TypeAlias

import msgspec

from tripwire.core.budget import RunCounters, Stop
from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.reasons import Verdict
from tripwire.core.signature import Signature
from tripwire.core.watch import Assessment

__all__ = [
    "Boundary",
    "BudgetStopped",
    "Decision",
    "Event",
    "ModelSpan",
    "RunEnded",
    "StillStuck",
    "ToolSpan",
    "TraceId",
    "VerdictChanged",
]

TraceId: TypeAlias = int | str
"""A run's key: the SDK's integer trace id, or its 32 hex characters (replay, OTLP). The engine
only hashes and compares it; one engine should be fed one form."""


class ToolSpan(msgspec.Struct, frozen=True, kw_only=True):
    """A finished tool span, mapped (:func:`tripwire.spans.map_tool_span`)."""

    trace_id: TraceId
    """The run it belongs to."""
    call: ToolCall
    """The tool call the span recorded."""
    signature: Signature | None = None
    """The call's signature, when the caller computed it already (replay signs once)."""
    root: bool = False
    """True when the span is the trace's local root: the run ends with it."""


class ModelSpan(msgspec.Struct, frozen=True, kw_only=True):
    """A finished model-call span, mapped (:func:`tripwire.spans.map_model_span`)."""

    trace_id: TraceId
    call: ModelCall
    """The call's usage (``cost_usd`` when the span reported one)."""
    root: bool = False
    """True when the span is the trace's local root: the run ends with it."""


class Boundary(msgspec.Struct, frozen=True, kw_only=True):
    """A run-boundary span ended (:func:`tripwire.spans.map_run_span`).

    ``root=True``: the trace's local root, the outermost agent invocation: the run ends.
    ``root=False``: a sub-agent ended: the loop window restarts (a sub-agent's calls are its own
    sequence), the budget goes on counting (it is the whole trace's).
    """

    trace_id: TraceId
    root: bool = False
    agent: str | None = None
    """The agent name, when the span recorded one."""


Event: TypeAlias = ToolSpan | ModelSpan | Boundary
"""What :meth:`tripwire.engine.Engine.observe` takes."""


class VerdictChanged(msgspec.Struct, frozen=True, kw_only=True):
    """A run's verdict changed at a tool call (a run's first ``working`` is not reported)."""

    trace_id: TraceId
    assessment: Assessment
    """The new verdict with its rule, tool, digest, hits, period, call index and reason."""
    previous: Verdict | None
    """The verdict before (``None`` at the run's first call)."""

    @property
    def stuck(self) -> bool:
        """True when the run is now ``stuck``: stop it (raise its kill flag)."""
        return self.assessment.verdict is Verdict.STUCK


class StillStuck(msgspec.Struct, frozen=True, kw_only=True):
    """A ``stuck`` run repeated itself again: a rule tripped at this call, the verdict did not
    change. Its stop must be in force (nudge, then kill: a flag lowered after a nudge goes up
    again at the next repeated call, not only when the verdict changes)."""

    trace_id: TraceId
    assessment: Assessment
    """The verdict in force after this call: ``stuck`` by the rule that made the run stuck,
    its counts including this call (what a flag raised again should say)."""
    call_index: int
    """1-based index of the call that repeated."""


class BudgetStopped(msgspec.Struct, frozen=True, kw_only=True):
    """A run reached a budget limit at one span (each limit is reported once per run)."""

    trace_id: TraceId
    stop: Stop
    """The limit that fired: ``reason``, ``limit_name``, ``limit``, ``observed``, message."""
    counters: RunCounters
    """What the run had consumed at that span."""
    tool_only: bool
    """True for a per-tool cap: refuse that tool only, not the run."""


class RunEnded(msgspec.Struct, frozen=True, kw_only=True):
    """The engine forgot a run: its root ended, it was ended explicitly, or it was evicted."""

    trace_id: TraceId
    cause: str
    """``"root"`` (the root span ended), ``"end"`` (:meth:`Engine.end`), ``"idle"`` or ``"lru"``."""
    verdict: Assessment | None
    """The verdict in force at the end (``None``: no tool call was judged)."""
    counters: RunCounters | None
    """What the run consumed (``None`` without limits)."""
    tool_calls: int
    """Tool calls judged in the run's last loop window segment."""


Decision: TypeAlias = VerdictChanged | StillStuck | BudgetStopped | RunEnded
"""What :meth:`tripwire.engine.Engine.observe` returns, in order."""
