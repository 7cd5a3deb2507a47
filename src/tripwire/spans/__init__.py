"""The span mapping: what agent frameworks put on their OpenTelemetry spans, as tripwire events.

Pure and dependency-light (no OpenTelemetry import, no I/O, no clock): one finished span, from
the SDK or decoded from an OTLP file, becomes a :class:`~tripwire.core.events.ToolCall`, a
:class:`~tripwire.core.events.ModelCall`, a :class:`RunBoundary`, or nothing. The span processor
(:mod:`tripwire.otel`), ``tripwire replay`` and the OTLP receiver of ``tripwire serve`` all map
spans with :func:`map_span` (or its parts), so they agree on every span.

See :mod:`tripwire.spans.mapping` for the recognition rules and the traps they handle, and
``docs/emitters.md`` for what each emitter records.
"""

from __future__ import annotations

from tripwire.spans.mapping import (
    MAPPING_VERSION,
    MAX_UNWRAP_BYTES,
    MappingStats,
    RunBoundary,
    SpanRole,
    SpanView,
    classify,
    map_model_span,
    map_run_span,
    map_span,
    map_tool_span,
    view_from_readable_span,
)

__all__ = [
    "MAPPING_VERSION",
    "MAX_UNWRAP_BYTES",
    "MappingStats",
    "RunBoundary",
    "SpanRole",
    "SpanView",
    "classify",
    "map_model_span",
    "map_run_span",
    "map_span",
    "map_tool_span",
    "view_from_readable_span",
]
