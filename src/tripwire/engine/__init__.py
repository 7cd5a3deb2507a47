"""One engine under every entry point: per-run state for many runs at once, decisions out.

The span processor (:mod:`tripwire.otel`), replay (:mod:`tripwire.replay`) and the OTLP receiver
of ``tripwire serve`` map spans with :mod:`tripwire.spans` and feed the events to an
:class:`Engine`; what comes back (:class:`VerdictChanged`, :class:`StillStuck`,
:class:`BudgetStopped`, :class:`RunEnded`) is theirs to act on. Free of OpenTelemetry and of
I/O; the clock is handed in::

    from tripwire.core.events import ToolCall
    from tripwire.engine import Engine, ToolSpan, VerdictChanged

    engine = Engine(clock=lambda: 0.0)
    for i in range(4):
        call = ToolCall(tool="search_docs", arguments={"query": "refund policy"})
        decisions = engine.observe(ToolSpan(trace_id="t1", call=call))
    assert isinstance(decisions[0], VerdictChanged) and decisions[0].stuck
    assert engine.verdict("t1").verdict == "stuck"
"""

from __future__ import annotations

from tripwire.engine._engine import (
    CALL_ID_MEMORY,
    DEFAULT_IDLE_TTL_S,
    DEFAULT_MAX_TRACES,
    Engine,
    EngineStats,
    PriceFn,
)
from tripwire.engine._values import (
    Boundary,
    BudgetStopped,
    Decision,
    Event,
    ModelSpan,
    RunEnded,
    StillStuck,
    ToolSpan,
    TraceId,
    VerdictChanged,
)

__all__ = [
    "CALL_ID_MEMORY",
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "Boundary",
    "BudgetStopped",
    "Decision",
    "Engine",
    "EngineStats",
    "Event",
    "ModelSpan",
    "PriceFn",
    "RunEnded",
    "StillStuck",
    "ToolSpan",
    "TraceId",
    "VerdictChanged",
]
