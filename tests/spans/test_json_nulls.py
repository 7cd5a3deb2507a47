"""OTLP/JSON as encoders other than the SDK's write it: ``null`` for an unset field (the
protobuf JSON mapping reads it as the field's default) and times as JSON floats. Both decoders
(the compiled fast path, which leaves such requests to msgspec, and msgspec alone under
``TRIPWIRE_NO_EXTENSIONS=1``) run this file."""

from __future__ import annotations

import json
from typing import Any

from tripwire.spans.otlp import decode_json

TRACE = "5b8efff798038103d269b633813fc60c"
ROOT = "eee19b7ec3c1b174"


def _request(spans: list[dict[str, Any]], **resource_spans: Any) -> bytes:
    rs: dict[str, Any] = {
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "billing"}}]},
        "scopeSpans": [{"scope": {"name": "agent"}, "spans": spans}],
        **resource_spans,
    }
    return json.dumps({"resourceSpans": [rs]}).encode()


def _tool(**fields: Any) -> dict[str, Any]:
    span: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": "eee19b7ec3c1b173",
        "parentSpanId": ROOT,
        "name": "execute_tool search",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000500000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
        ],
        "status": {"code": 2, "message": "timed out"},
    }
    span.update(fields)
    return span


def test_null_is_the_fields_default_wherever_it_stands() -> None:
    plain = decode_json(_request([_tool(), {"traceId": TRACE, "spanId": ROOT, "name": "invoke_agent a"}]))
    nulls = _request(
        [
            _tool(
                events=None,
                attributes=[
                    {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool", "intValue": None}},
                    {"key": "gen_ai.tool.name", "value": {"stringValue": "search", "arrayValue": None}},
                    {"key": "gen_ai.tool.call.arguments", "value": None},
                ],
            ),
            {"traceId": TRACE, "spanId": ROOT, "parentSpanId": None, "name": "invoke_agent a",
             "startTimeUnixNano": None, "endTimeUnixNano": None, "attributes": None, "events": None,
             "status": None},
        ],
        instrumentationLibrarySpans=None,
    )
    got = decode_json(nulls)
    assert got.rejected == 0 and got.bad_times == 0
    # The null attribute value is kept as an attribute without a value; the rest is the same.
    tool = got.views[0]
    assert tool.attributes == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                               "gen_ai.tool.call.arguments": None}
    assert [(v.trace_id, v.span_id, v.parent_span_id, v.name, v.start_s, v.end_s, v.status_error) for v in got.views] == [
        (v.trace_id, v.span_id, v.parent_span_id, v.name, v.start_s, v.end_s, v.status_error) for v in plain.views
    ]
    assert got.views[1].parent_span_id is None and got.views[1].attributes == {}
    assert tool.resource_attributes == {"service.name": "billing"}


def test_null_lists_and_names_are_empty() -> None:
    body = json.dumps({"resourceSpans": [
        {"resource": {"attributes": None}, "scopeSpans": None, "instrumentationLibrarySpans": [
            {"scope": {"name": None}, "spans": [{"traceId": TRACE, "spanId": ROOT, "name": None,
                                               "attributes": [{"key": None, "value": {"kvlistValue": {"values": None}}}]}]},
            {"scope": None, "spans": None},
        ]},
    ]}).encode()
    got = decode_json(body)
    (span,) = got.views
    assert (span.name, span.scope_name, span.resource_attributes, span.attributes) == ("", None, {}, {})
    empty = decode_json(b'{"resourceSpans": null}')
    assert empty.views == [] and empty.envelope and empty.rejected == 0


def test_times_written_as_json_floats_are_read_to_the_nanosecond_they_round_to() -> None:
    got = decode_json(_request([
        _tool(startTimeUnixNano=1.7e18, endTimeUnixNano=1700000000500000000.0),
        _tool(spanId="eee19b7ec3c1b175", startTimeUnixNano=-1.0, endTimeUnixNano=1e30),
    ]))
    first, second = got.views
    assert (first.start_s, first.end_s) == (1.7e9, 1700000000.5)
    # Not a time: before 1970, or past what 64 bits of nanoseconds hold. The span is kept.
    assert (second.start_s, second.end_s) == (None, None) and got.bad_times == 2


def _pb(span_id: bytes, parent: bytes) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.parent_span_id, span.name = bytes.fromhex(TRACE), span_id, parent, "s"
    return req.SerializeToString()


def test_an_all_zero_span_id_is_no_id_and_an_all_zero_parent_is_no_parent() -> None:
    # OpenTelemetry: an id of all zeros is invalid. Such a span is rejected alone (partial
    # success); a parent of all zeros is a root, in protobuf and in JSON alike.
    from tripwire.spans.otlp import decode_protobuf

    zeros = "0" * 16
    for got in (
        decode_json(_request([_tool(spanId=zeros), _tool(spanId="eee19b7ec3c1b175", parentSpanId=zeros)])),
        decode_json(_request([_tool(spanId=zeros.upper()), _tool(spanId="eee19b7ec3c1b175", parentSpanId=zeros)])),
    ):
        assert got.rejected == 1 and got.bad_ids == 1
        (kept,) = got.views
        assert kept.span_id == "eee19b7ec3c1b175" and kept.parent_span_id is None
    bad = decode_protobuf(_pb(bytes(8), bytes.fromhex(ROOT)))
    assert (bad.rejected, bad.bad_ids, bad.views) == (1, 1, [])
    root = decode_protobuf(_pb(bytes.fromhex(ROOT), bytes(8)))
    assert root.rejected == 0 and root.views[0].parent_span_id is None
