"""Replay of real framework runs: finished SDK spans → OTLP/JSON file → ``replay_traces``.

The harness runs each framework offline; this module writes its spans the way the OTLP file
exporter does (the JSON mapping, hex ids, nanosecond strings) and replays them. Expectations
come from the scripts: the looping agent repeats ``search_docs(query="refund policy")``
``LOOP_CALLS`` (8) times, so a repetition rule with threshold 4 in a window of 10 first says
``stuck`` at call 4, with 4 calls after it; the distinct agent makes 12 different calls.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.replay.engine import replay_traces

from .harness import DISTINCT_CALLS, LOOP_CALLS

pytestmark = pytest.mark.frameworks

POLICY = LoopPolicy(name="frameworks", window=10, threshold=4, max_period=None, result_evidence="off")


def _any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, (tuple, list)):
        return {"arrayValue": {"values": [_any_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _attributes(attrs: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in (attrs or {}).items()]


def to_otlp_json(spans: Sequence[Any]) -> dict[str, Any]:
    """An ExportTraceServiceRequest (JSON mapping) of SDK ``ReadableSpan`` objects."""
    groups: dict[tuple[int, int], list[Any]] = defaultdict(list)
    resources: dict[int, Any] = {}
    scopes: dict[int, Any] = {}
    for span in spans:
        resources[id(span.resource)] = span.resource
        scopes[id(span.instrumentation_scope)] = span.instrumentation_scope
        groups[(id(span.resource), id(span.instrumentation_scope))].append(span)
    by_resource: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (rid, sid), members in groups.items():
        scope = scopes[sid]
        out = []
        for sp in members:
            ctx = sp.context
            item: dict[str, Any] = {
                "traceId": f"{ctx.trace_id:032x}",
                "spanId": f"{ctx.span_id:016x}",
                "name": sp.name,
                "kind": int(sp.kind.value) + 1,
                "startTimeUnixNano": str(sp.start_time),
                "endTimeUnixNano": str(sp.end_time),
                "attributes": _attributes(sp.attributes),
                "events": [{"name": e.name, "timeUnixNano": str(e.timestamp), "attributes": _attributes(e.attributes)} for e in sp.events],
                "status": {"code": sp.status.status_code.value, **({"message": sp.status.description} if sp.status.description else {})},
            }
            if sp.parent is not None:
                item["parentSpanId"] = f"{sp.parent.span_id:016x}"
            out.append(item)
        by_resource[rid].append({"scope": {"name": scope.name if scope else ""}, "spans": out})
    return {
        "resourceSpans": [
            {"resource": {"attributes": _attributes(resources[rid].attributes if resources[rid] else {})}, "scopeSpans": ss}
            for rid, ss in by_resource.items()
        ]
    }


def _runner(name: str) -> Callable[[bool], tuple[Any, ...]]:
    from . import harness

    if name == "pydantic_ai":
        pytest.importorskip("pydantic_ai")
        return harness.run_pydantic_ai
    if name.startswith("langchain"):
        pytest.importorskip("langgraph")
        inst = name.split(":")[1]
        pytest.importorskip("openinference.instrumentation.langchain" if inst == "openinference" else "opentelemetry.instrumentation.langchain")
        return lambda loop: harness.run_langchain(loop, instrumentation=inst)
    if name.startswith("openai_agents"):
        pytest.importorskip("agents")
        bridge = name.split(":")[1]
        pytest.importorskip("openinference.instrumentation.openai_agents" if bridge == "openinference" else "opentelemetry.instrumentation.openai_agents")
        return lambda loop: harness.run_openai_agents(loop, bridge=bridge)
    if name.startswith("google_adk"):
        pytest.importorskip("google.adk")
        schema = int(name.split(":")[1])
        return lambda loop: harness.run_adk(loop, schema=schema)
    pytest.importorskip("smolagents")
    pytest.importorskip("openinference.instrumentation.smolagents")
    return harness.run_smolagents


def _extra(framework: str) -> int:
    """smolagents records its ``final_answer`` as one more tool span (docs/emitters.md), at the end."""
    return 1 if framework == "smolagents" else 0


FRAMEWORKS = ["pydantic_ai", "langchain:openinference", "langchain:openllmetry",
              "openai_agents:openinference", "openai_agents:openllmetry", "smolagents",
              "google_adk:2", "google_adk:1"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_looping_run_replays_stuck_at_call_4(framework: str, tmp_path: Path) -> None:
    spans = _runner(framework)(True)
    path = tmp_path / "loop.json.gz"  # gzip, as a Collector might write it
    path.write_bytes(gzip.compress(json.dumps(to_otlp_json(spans)).encode()))
    results = [r for r in replay_traces(path, POLICY) if r.tool_calls]
    assert len(results) == 1, [r.to_json() for r in results]
    (r,) = results
    assert r.tool_calls == LOOP_CALLS + _extra(framework)
    assert r.arguments_seen is True
    assert r.first_trip is not None
    assert (r.first_trip.call_index, r.first_trip.tool, r.first_trip.rule) == (4, "search_docs", Rule.REPETITION)
    assert r.calls_after_trip == LOOP_CALLS - 4 + _extra(framework)
    assert r.verdict is Verdict.STUCK
    assert "refund" not in json.dumps(r.to_json())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_distinct_run_replays_working(framework: str, tmp_path: Path) -> None:
    spans = _runner(framework)(False)
    path = tmp_path / "distinct.json"
    path.write_text(json.dumps(to_otlp_json(spans)))
    results = [r for r in replay_traces(path, POLICY) if r.tool_calls]
    assert len(results) == 1
    (r,) = results
    assert r.tool_calls == DISTINCT_CALLS + _extra(framework)
    assert (r.verdict, r.first_trip, r.calls_after_trip) == (Verdict.WORKING, None, 0)
