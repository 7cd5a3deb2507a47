"""The Vercel AI SDK's own telemetry (npm ``ai`` 6), as recorded from the real package by
``clients/typescript/test/record_golden.ts``: a failing tool and a run recorded with
``recordInputs: false, recordOutputs: false`` (golden ``ai_sdk_tool_error`` and
``ai_sdk_unrecorded``), and the recognition rules on hand-made attributes.

The agents ran the first four calls of ``test_golden.CALLS``; in ``ai_sdk_tool_error`` the
first ``search_docs`` body threw ``TypeError("search index unavailable")``.
"""

from __future__ import annotations

import hashlib
import json

import msgspec
import pytest
from test_golden import CALLS, GOLDEN, PIN_VERSIONS, load, mapped

from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER
from tripwire.spans import (
    MAPPING_VERSION,
    MappingStats,
    RunBoundary,
    SpanRole,
    SpanView,
    classify,
    map_span,
)


def test_a_throwing_tool_is_a_failed_call_and_the_run_goes_on() -> None:
    tools, models, runs, stats = mapped("ai_sdk_tool_error")
    assert [c.tool for c in tools] == [t for t, _, _ in CALLS]
    assert [c.error_type for c in tools] == ["TypeError", None, None, None]
    assert tools[0].result_digest is None and None not in [c.result_digest for c in tools[1:]]
    assert [json.loads(c.arguments) for c in tools] == [{k: v} for _, k, v in CALLS]
    assert [r.agent for r in runs] == ["researcher"] and not runs[0].failed
    assert len(models) == 2 and stats.malformed == 0


def test_unrecorded_arguments_are_absent_not_empty() -> None:
    # recordOutputs: false drops ai.toolCall.args too (the SDK files the arguments under
    # outputs); the tool name and the call id remain.
    tools, models, _, _ = mapped("ai_sdk_unrecorded")
    assert [c.tool for c in tools] == [t for t, _, _ in CALLS]
    assert all(c.arguments is ABSENT and c.result_digest is None for c in tools)
    assert [c.call_id for c in tools] == [f"call_{i}" for i in range(4)]
    assert {(m.input_tokens, m.output_tokens) for m in models} == {(10, 3)}


PINNED = {"ai_sdk_tool_error": "fc90e7f8a54662e3", "ai_sdk_unrecorded": "ec430e9736cdb6de"}


def _absent(value: object) -> str:
    if value is ABSENT:
        return "<absent>"
    raise NotImplementedError(type(value))


def _digest(name: str) -> str:
    """As test_golden's digest, with absent arguments written as a marker."""
    out: list[object] = []
    for view in load(name):
        event = map_span(view)
        if isinstance(event, ToolCall):
            sig = DEFAULT_NORMALIZER.signature(event.tool, event.arguments)
            item = msgspec.to_builtins(event, enc_hook=_absent)
            out.append(["tool", item, sig.digest, sig.kind.value])
        elif isinstance(event, (ModelCall, RunBoundary)):
            out.append([type(event).__name__, msgspec.to_builtins(event)])
        else:
            out.append(None)
    return hashlib.sha256(msgspec.json.encode(out)).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_the_mapping_output_is_pinned(name: str) -> None:
    got = _digest(name)
    assert (MAPPING_VERSION, DEFAULT_NORMALIZER.version) == PIN_VERSIONS and got == PINNED[name], got


def _view(attributes: dict[str, object], name: str = "ai.toolCall", **kw: object) -> SpanView:
    return SpanView(trace_id="a" * 32, span_id="b" * 16, name=name, attributes=attributes, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("op", "role"),
    [
        ("ai.toolCall", SpanRole.TOOL),
        ("ai.generateText.doGenerate", SpanRole.MODEL),
        ("ai.streamText.doStream", SpanRole.MODEL),
        ("ai.generateObject.doGenerate", SpanRole.MODEL),
        ("ai.generateText", SpanRole.RUN),
        ("ai.streamText", SpanRole.RUN),
        ("ai.generateObject", SpanRole.OTHER),
        ("ai.embed", SpanRole.OTHER),
        ("ai.embedMany.doEmbed", SpanRole.OTHER),
        (["ai.toolCall"], SpanRole.OTHER),
        (7, SpanRole.OTHER),
    ],
)
def test_the_operation_id_decides(op: object, role: SpanRole) -> None:
    assert classify({"ai.operationId": op}, "ai.toolCall") is role


def test_genai_conventions_come_first() -> None:
    # ai 7's @ai-sdk/otel spans (and any span with both) are read by the GenAI keys.
    attrs = {"gen_ai.operation.name": "chat", "ai.operationId": "ai.toolCall"}
    assert classify(attrs, "chat m") is SpanRole.MODEL


def test_odd_values_never_raise() -> None:
    stats = MappingStats()
    for attrs in (
        {"ai.operationId": "ai.toolCall"},  # no name attribute: the span name is the last resort
        {"ai.operationId": "ai.toolCall", "ai.toolCall.name": 3, "ai.toolCall.args": 5},
        {"ai.operationId": "ai.toolCall", "ai.toolCall.name": "t", "ai.toolCall.id": ["x"]},
        {"ai.operationId": "ai.generateText"},
        {"ai.operationId": "ai.streamText.doStream", "gen_ai.usage.input_tokens": "x"},
    ):
        event = map_span(_view(attrs), stats=stats)
        assert event is None or isinstance(event, (ToolCall, ModelCall, RunBoundary))
    tool = map_span(_view({"ai.operationId": "ai.toolCall", "ai.toolCall.name": "t", "ai.toolCall.id": ["x"]}))
    assert isinstance(tool, ToolCall) and tool.call_id is None and tool.arguments is ABSENT
    run = map_span(_view({"ai.operationId": "ai.generateText"}, name="ai.generateText"))
    assert isinstance(run, RunBoundary) and run.agent == "ai.generateText"
    assert stats.malformed == 0


def _otlp_json(name: str) -> bytes:
    """The golden spans as the JS OTLP/HTTP exporter sends them (JSON: hex ids, string ints)."""

    def value(v: object) -> dict[str, object]:
        if isinstance(v, bool):
            return {"boolValue": v}
        if isinstance(v, int):
            return {"intValue": str(v)}
        if isinstance(v, float):
            return {"doubleValue": v}
        if isinstance(v, list):
            return {"arrayValue": {"values": [value(x) for x in v]}}
        return {"stringValue": v}

    data = json.loads((GOLDEN / f"{name}.json").read_text())
    spans = []
    for s in data["spans"]:
        span = {
            "traceId": s["trace_id"], "spanId": s["span_id"], "name": s["name"], "kind": 1,
            "startTimeUnixNano": str(int(s["start_s"] * 1e9)), "endTimeUnixNano": str(int(s["end_s"] * 1e9)),
            "attributes": [{"key": k, "value": value(v)} for k, v in s["attributes"].items()],
            "status": {"code": 2, "message": s["status_message"]} if s["status_error"] else {"code": 0},
            "events": [{"name": "exception", "timeUnixNano": "1", "attributes": [
                {"key": "exception.type", "value": {"stringValue": s["exception_type"]}}]}]
            if s["exception_type"] else [],
        }  # fmt: skip
        if s["parent_span_id"]:
            span["parentSpanId"] = s["parent_span_id"]
        spans.append(span)
    request = {"resourceSpans": [{"resource": {"attributes": []},
                                  "scopeSpans": [{"scope": {"name": "ai"}, "spans": spans}]}]}  # fmt: skip
    return json.dumps(request).encode()


@pytest.mark.parametrize("name", ["ai_sdk_generate_text", "ai_sdk_stream_text", "ai_sdk_tool_error"])
def test_the_receivers_decoder_keeps_what_the_mapping_reads(name: str) -> None:
    # The decoder drops every attribute it is not told to keep (the AI SDK's prompts and
    # answers under "ai."): what it keeps must map to the same calls, models and runs.
    from tripwire.spans.otlp import decode_json

    decoded = decode_json(_otlp_json(name))
    got = [map_span(s.view()) for s in decoded.views]
    want = [map_span(v) for v in load(name)]
    untimed = [
        None if e is None else (type(e).__name__, {**msgspec.to_builtins(e), "start_s": 0, "end_s": 0})
        for e in (*got, *want)
    ]
    assert untimed[: len(got)] == untimed[len(got) :]
    assert sum(isinstance(e, ToolCall) for e in got) == 4 and sum(isinstance(e, RunBoundary) for e in got) == 1
    kept = {k for s in decoded.views for k in s.view().attributes}
    assert "ai.prompt.messages" not in kept and "ai.response.text" not in kept
