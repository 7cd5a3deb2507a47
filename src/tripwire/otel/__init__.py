"""OpenTelemetry adapters (``pip install 'tripwire[otel]'``): the span processor and the kill flag.

::

    import tripwire.otel

    tripwire.otel.instrument()          # watch every agent's tool spans in this process
    ...
    tripwire.otel.check()               # before each step: raises LoopDetected when stuck,
                                        # BudgetExceeded when a budget (limits=) is used up

The pieces: :mod:`~tripwire.otel.processor` (:class:`TripwireSpanProcessor`, a thin shell over
:class:`tripwire.engine.Engine`), :mod:`~tripwire.otel.killswitch` (the in-process kill flag)
and :mod:`~tripwire.otel.setup` (:func:`instrument`). The span mapping they use is the pure
package :mod:`tripwire.spans` (re-exported here), which needs no OpenTelemetry install.
See ``docs/otel.md``.
"""

from __future__ import annotations

try:
    import opentelemetry.sdk.trace
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "tripwire.otel needs the OpenTelemetry API and SDK, which are not installed: "
        "pip install 'tripwire[otel]' (the span mapping alone is tripwire.spans)"
    ) from exc

from tripwire.otel.killswitch import KILL_FLAGS, KillFlag, KillFlags, check, clear
from tripwire.otel.processor import (
    DEFAULT_IDLE_TTL_S,
    DEFAULT_MAX_TRACES,
    BudgetStop,
    ProcessorStats,
    TripwireSpanProcessor,
    VerdictChange,
)
from tripwire.otel.setup import (
    EXPORT_DELAY_MS,
    export_processor,
    instrument,
    limits_from_env,
    policy_from_env,
)
from tripwire.spans import (
    MAPPING_VERSION,
    MappingStats,
    RunBoundary,
    SpanRole,
    SpanView,
    classify,
    map_span,
    view_from_readable_span,
)

__all__ = [
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "EXPORT_DELAY_MS",
    "KILL_FLAGS",
    "MAPPING_VERSION",
    "BudgetStop",
    "KillFlag",
    "KillFlags",
    "MappingStats",
    "ProcessorStats",
    "RunBoundary",
    "SpanRole",
    "SpanView",
    "TripwireSpanProcessor",
    "VerdictChange",
    "check",
    "classify",
    "clear",
    "export_processor",
    "instrument",
    "limits_from_env",
    "map_span",
    "policy_from_env",
    "view_from_readable_span",
]
