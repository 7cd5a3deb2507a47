"""``POST /api/runs/{trace_id}/receipt``: an agent in another language posts its run's stop
receipt, and the run's row carries it (and its health, classified here) for the dashboard and
``tripwire report``. A real service on loopback (uvicorn in a thread), real HTTP, SQLite."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tripwire.core import receipt as rc
from tripwire.report import build_report
from tripwire.serve.posted_receipts import MAX_RECEIPT_BYTES

from .conftest import TOKEN, Running
from .otlp_helpers import loop_spans, protobuf_body, trace_id_of

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def receipt_for(trace_id: str, **fields: Any) -> dict[str, Any]:
    """A receipt as the TypeScript client writes one (every field, Python's order)."""
    out: dict[str, Any] = {
        "schema": "tripwire.stop_receipt/1",
        "run_id": trace_id,
        "agent": "ts-agent",
        "end": "natural_finish",
        "reason": "completed",
        "condition": {},
        "policy_version": None,
        "normalizer_version": None,
        "counters": {"steps": 3, "tool_calls": 2, "input_tokens": 30, "output_tokens": 9,
                     "cost_usd": None, "duration_s": 0.5, "unpriced_calls": 0},
        "verdict": "working",
        "approval": None,
        "outcomes": [],
        "requires_outcome": "none",
        "tool_failure": None,
        "started_at": 1000.0,
        "ended_at": 1000.5,
        "after_stop": None,
    }  # fmt: skip
    out.update(fields)
    return out


def post(service: Running, trace_id: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{service.url}/api/runs/{trace_id}/receipt",
        content=content,
        headers=service.headers() if headers is None else headers,
        timeout=10,
    )


def until(check: Callable[[], Any], timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError("timed out")


TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_the_token_is_required(service: Running) -> None:
    assert post(service, TRACE, receipt_for(TRACE), headers={}).status_code == 401
    wrong = {"Authorization": "Bearer not-" + TOKEN}
    assert post(service, TRACE, receipt_for(TRACE), headers=wrong).status_code == 401
    assert service.store.run(TRACE) is None


def test_anything_but_a_receipt_is_refused_naming_the_field(service: Running) -> None:
    cases = {
        "unknown field": (receipt_for(TRACE, status="done"), "status"),
        "another run": (receipt_for("a" * 32), "run_id"),
        "wrong type": (receipt_for(TRACE, counters={"steps": -1}), "counters.steps"),
        "unknown end": (receipt_for(TRACE, end="finished"), "end"),
        "other schema": (receipt_for(TRACE, schema="tripwire.stop_receipt/9"), "schema"),
        "a model's claim": ({"status": "done"}, "status"),
        "no run": ({"agent": "x", "end": None, "reason": None}, "run_id"),
    }
    for name, (body, field) in cases.items():
        got = post(service, TRACE, body)
        assert got.status_code == 400, name
        assert f"'{field}'" in got.json()["detail"], (name, got.json())
    assert post(service, TRACE, b"{not json").status_code == 400
    assert post(service, "xyz", receipt_for("xyz")).status_code == 400
    assert post(service, "0" * 32, receipt_for("0" * 32)).status_code == 400
    big = receipt_for(TRACE, agent="a" * (MAX_RECEIPT_BYTES + 1))
    assert post(service, TRACE, big).status_code == 413
    assert service.store.run(TRACE) is None


def test_a_run_no_span_announced_gets_a_row_from_its_receipt(service: Running) -> None:
    got = post(service, TRACE, receipt_for(TRACE))
    assert got.status_code == 200, got.text
    assert got.json() == {"ok": True, "trace_id": TRACE, "health": "complete_unverified",
                          "stop_reason": "completed", "pending": False}  # fmt: skip
    row = service.store.run(TRACE)
    assert row is not None and row.status == "ended" and row.agent == "ts-agent"
    assert (row.steps, row.tool_calls, row.input_tokens, row.output_tokens) == (3, 2, 30, 9)
    assert row.health == "complete_unverified" and row.stop_reason == "completed"
    assert rc.StopReceipt.from_dict(row.receipt) == rc.StopReceipt.from_dict(receipt_for(TRACE))
    report = build_report(service.store)
    assert report.overall.runs == 1 and report.overall.health == {"complete_unverified": 1}


def test_an_ended_run_carries_the_agents_receipt(service: Running) -> None:
    spans = loop_spans(6, agent="ts-agent")
    tid = trace_id_of(spans)
    sent = httpx.post(f"{service.url}/v1/traces", content=protobuf_body(spans),
                      headers={**service.headers(), **PROTOBUF}, timeout=10)  # fmt: skip
    assert sent.status_code == 200
    ended = until(lambda: (r := service.store.run(tid)) is not None and r.status == "ended" and r)
    # The trace alone: the root span ended without error, after the loop verdict.
    assert ended.receipt["reason"] == "loop_detected" and ended.verdict == "stuck"
    # The agent obeyed the flag: its stopWhen ended the loop; its receipt says how.
    flagged = receipt_for(
        tid, end="stop_condition", reason="loop_detected", verdict="stuck",
        condition={"rule": "repetition", "tool": "search_docs", "hits": 4, "call_index": 4,
                   "source": "fleet", "by": "tripwire serve", "at": 1000.2},
        after_stop={"model_calls": 0, "tool_calls": 0},
    )  # fmt: skip
    got = post(service, tid, flagged)
    assert got.status_code == 200, got.text
    assert got.json()["health"] == "stuck" and got.json()["pending"] is False
    row = service.store.run(tid)
    assert row is not None and row.receipt is not None
    assert row.receipt["condition"]["source"] == "fleet" and row.receipt["after_stop"] == {
        "model_calls": 0, "tool_calls": 0}  # fmt: skip
    assert row.health == "stuck" and row.stop_reason == "loop_detected" and row.status == "ended"
    # The counters stay the service's (from the spans), not the receipt's.
    assert row.tool_calls == 6
    # A run that went on after the stop is no clean stop, whatever its reason says.
    went_on = dict(flagged, after_stop={"model_calls": 2, "tool_calls": 1})
    assert post(service, tid, went_on).json()["health"] == "uncertain"
    assert service.store.run(tid).health == "uncertain"  # type: ignore[union-attr]


def test_a_run_still_going_takes_the_receipt_at_its_end(service: Running) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    attrs = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "ts-agent"}
    with tracer.start_as_current_span("invoke_agent ts-agent", attributes=attrs) as root:
        tid = f"{root.get_span_context().trace_id:032x}"
        for i, query in enumerate(("billing", "shipping")):
            with tracer.start_as_current_span("execute_tool search_docs", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.id": f"call_{i}", "gen_ai.tool.call.arguments": json.dumps({"query": query}),
            }):  # fmt: skip
                pass
        tools = exporter.get_finished_spans()
        httpx.post(f"{service.url}/v1/traces", content=protobuf_body(tools),
                   headers={**service.headers(), **PROTOBUF}, timeout=10).raise_for_status()  # fmt: skip
        until(lambda: (r := service.store.run(tid)) is not None and r.tool_calls == 2)
        # The agent's loop hit its step cap; its receipt arrives before its root span.
        capped = receipt_for(tid, end="stop_condition", reason="max_steps",
                             condition={"steps": 2, "max_steps": 2})  # fmt: skip
        got = post(service, tid, capped)
        assert got.status_code == 200 and got.json()["pending"] is True
        assert got.json()["health"] == "bounded_stop"
        running = service.store.run(tid)
        assert running is not None and running.status == "running" and running.receipt is None
    provider.shutdown()
    rest = [s for s in exporter.get_finished_spans() if s.parent is None]
    httpx.post(f"{service.url}/v1/traces", content=protobuf_body(rest),
               headers={**service.headers(), **PROTOBUF}, timeout=10).raise_for_status()  # fmt: skip
    row = until(lambda: (r := service.store.run(tid)) is not None and r.status == "ended" and r)
    # Without the agent's receipt the trace would say natural_finish / completed.
    assert row.receipt["reason"] == "max_steps" and row.receipt["condition"] == {"max_steps": 2, "steps": 2}
    assert row.health == "bounded_stop" and row.stop_reason == "max_steps"
    assert row.tool_calls == 2
