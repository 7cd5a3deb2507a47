"""Hand-written OTLP/JSON builders for the replay tests (the JSON mapping, hex ids).

These write exactly what the OpenTelemetry file exporter writes; nothing here uses tripwire.
"""

from __future__ import annotations

import json
from typing import Any

T0 = 1_700_000_000_000_000_000
"""Nanoseconds: an arbitrary start of time for the fixtures."""


def trace_id(n: int) -> str:
    return f"{n:032x}"


def span_id(n: int) -> str:
    return f"{n:016x}"


def s(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def tool_span(
    trace: int,
    span: int,
    tool: str,
    args: dict[str, Any] | None,
    *,
    at: int,
    parent: int | None = 1,
    result: str | None = None,
    call_id: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """An ``execute_tool`` span starting ``at`` seconds after :data:`T0` (status ERROR with
    ``error.type`` when ``error`` is given)."""
    attrs = [s("gen_ai.operation.name", "execute_tool"), s("gen_ai.tool.name", tool)]
    if args is not None:
        attrs.append(s("gen_ai.tool.call.arguments", json.dumps(args)))
    if result is not None:
        attrs.append(s("gen_ai.tool.call.result", result))
    if call_id is not None:
        attrs.append(s("gen_ai.tool.call.id", call_id))
    if error is not None:
        attrs.append(s("error.type", error))
    out: dict[str, Any] = {
        "traceId": trace_id(trace),
        "spanId": span_id(span),
        "name": f"execute_tool {tool}",
        "kind": 1,
        "startTimeUnixNano": str(T0 + at * 10**9),
        "endTimeUnixNano": str(T0 + at * 10**9 + 10**8),
        "attributes": attrs,
        "status": {} if error is None else {"code": 2, "message": error},
    }
    if parent is not None:
        out["parentSpanId"] = span_id(parent)
    return out


def agent_span(trace: int, span: int, agent: str, *, at: int = 0) -> dict[str, Any]:
    """A root ``invoke_agent`` span."""
    return {
        "traceId": trace_id(trace),
        "spanId": span_id(span),
        "name": f"invoke_agent {agent}",
        "startTimeUnixNano": str(T0 + at * 10**9),
        "endTimeUnixNano": str(T0 + (at + 1000) * 10**9),
        "attributes": [s("gen_ai.operation.name", "invoke_agent"), s("gen_ai.agent.name", agent)],
        "status": {},
    }


def request(*groups: list[dict[str, Any]], service: str = "svc") -> dict[str, Any]:
    """An ExportTraceServiceRequest with one resourceSpans per group of spans."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [s("service.name", service)]},
                "scopeSpans": [{"scope": {"name": "test"}, "spans": spans}],
            }
            for spans in groups
        ]
    }


def dumps(obj: Any) -> str:
    return json.dumps(obj)


def repeated(trace: int, n: int, *, tool: str = "search_docs", args: dict[str, Any] | None = None,
             first_span: int = 100, agent: str | None = "looper") -> list[dict[str, Any]]:
    """A trace of ``n`` identical calls (same tool, same arguments), one per second."""
    spans = [agent_span(trace, 1, agent)] if agent else []
    a = {"query": "refund policy"} if args is None else args
    spans += [tool_span(trace, first_span + i, tool, a, at=i + 1) for i in range(n)]
    return spans


def distinct(trace: int, n: int, *, first_span: int = 100, agent: str | None = "researcher") -> list[dict[str, Any]]:
    """A trace of ``n`` different calls."""
    spans = [agent_span(trace, 1, agent)] if agent else []
    spans += [
        tool_span(trace, first_span + i, "search_docs", {"query": f"topic {i}"}, at=i + 1)
        for i in range(n)
    ]
    return spans
