"""OpenTelemetry adapters (``pip install 'tripwire[otel]'``): span mapping and the span processor.

::

    import tripwire.otel

    tripwire.otel.instrument()          # watch every agent's tool spans in this process
    ...
    tripwire.otel.check()               # before each step: raises LoopDetected when stuck,
                                        # BudgetExceeded when a budget (limits=) is used up

The pieces: :mod:`~tripwire.otel.conventions` (span → event mapping),
:mod:`~tripwire.otel.processor` (:class:`TripwireSpanProcessor`),
:mod:`~tripwire.otel.killswitch` (the in-process kill flag) and
:mod:`~tripwire.otel.setup` (:func:`instrument`). See ``docs/otel.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

# The span mapping is pure (no OpenTelemetry import): ``tripwire replay`` uses it on the core
# install. Everything that needs the OpenTelemetry SDK is imported on first use, and a missing
# extra then says what to install.
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

_LAZY = {
    "BudgetStop": "tripwire.otel.processor",
    "DEFAULT_IDLE_TTL_S": "tripwire.otel.processor",
    "DEFAULT_MAX_TRACES": "tripwire.otel.processor",
    "ProcessorStats": "tripwire.otel.processor",
    "TripwireSpanProcessor": "tripwire.otel.processor",
    "VerdictChange": "tripwire.otel.processor",
    "KILL_FLAGS": "tripwire.otel.killswitch",
    "KillFlag": "tripwire.otel.killswitch",
    "KillFlags": "tripwire.otel.killswitch",
    "check": "tripwire.otel.killswitch",
    "clear": "tripwire.otel.killswitch",
    "instrument": "tripwire.otel.setup",
    "policy_from_env": "tripwire.otel.setup",
    "limits_from_env": "tripwire.otel.setup",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tripwire.otel' has no attribute {name!r}")
    try:
        import opentelemetry.sdk.trace
        import opentelemetry.trace  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"tripwire.otel.{name} needs the OpenTelemetry API and SDK, which are not "
            "installed: pip install 'tripwire[otel]'"
        ) from exc
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
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
    "instrument",
    "limits_from_env",
    "map_span",
    "policy_from_env",
    "view_from_readable_span",
]
