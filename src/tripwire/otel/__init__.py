"""OpenTelemetry adapters (``pip install 'tripwire[otel]'``): span mapping and the span processor.

::

    import tripwire.otel

    tripwire.otel.instrument()          # watch every agent's tool spans in this process
    ...
    tripwire.otel.check()               # before each step: raises LoopDetected when stuck

The pieces: :mod:`~tripwire.otel.conventions` (span → event mapping),
:mod:`~tripwire.otel.processor` (:class:`TripwireSpanProcessor`),
:mod:`~tripwire.otel.killswitch` (the in-process kill flag) and
:mod:`~tripwire.otel.setup` (:func:`instrument`). See ``docs/otel.md``.
"""

from __future__ import annotations

try:
    import opentelemetry.sdk.trace
    import opentelemetry.trace  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tripwire.otel needs the OpenTelemetry API and SDK, which are not installed: "
        "pip install 'tripwire[otel]'"
    ) from exc

from tripwire.otel.conventions import (
    MAPPING_VERSION,
    MappingStats,
    RunBoundary,
    SpanRole,
    SpanView,
    classify,
    map_span,
    view_from_readable_span,
)
from tripwire.otel.killswitch import KILL_FLAGS, KillFlag, KillFlags, check, clear
from tripwire.otel.processor import (
    DEFAULT_IDLE_TTL_S,
    DEFAULT_MAX_TRACES,
    ProcessorStats,
    TripwireSpanProcessor,
    VerdictChange,
)
from tripwire.otel.setup import instrument, policy_from_env

__all__ = [
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "KILL_FLAGS",
    "MAPPING_VERSION",
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
    "instrument",
    "map_span",
    "policy_from_env",
    "view_from_readable_span",
]
