"""The OTLP/HTTP receiver answers as the OTLP specification says, to stock exporters too."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest

from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore

from .conftest import TOKEN, Running, running_service
from .otlp_helpers import json_body, loop_spans, protobuf_body, trace_id_of

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}


def _auth(headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Authorization": f"Bearer {TOKEN}"}


def _wait_run(r: Running, trace_id: str, **expect: object) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while True:
        got = httpx.get(f"{r.url}/api/runs/{trace_id}", headers=r.headers())
        if got.status_code == 200:
            body = got.json()
            if all(body.get(k) == v for k, v in expect.items()):
                return body
        if time.monotonic() > deadline:
            raise AssertionError(f"run {trace_id} never matched {expect}: {got.text[:500]}")
        time.sleep(0.05)


def test_stock_exporter_and_batch_processor_work_unchanged(service: Running) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    exporter = OTLPSpanExporter(
        endpoint=f"{service.url}/v1/traces", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=20))
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span(
        "invoke_agent looper",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
    ) as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        for i in range(5):
            with tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    "gen_ai.tool.call.id": f"c{i}",
                    "gen_ai.tool.call.arguments": json.dumps({"query": "refund policy"}),
                    "gen_ai.tool.call.result": "No results.",
                },
            ):
                pass
            provider.force_flush()
    assert provider.force_flush()
    provider.shutdown()
    run = _wait_run(service, trace_id, status="ended")
    assert run["verdict"] == "stuck"
    assert run["rule"] == "repetition"
    assert run["first_stuck_call"] == 4
    assert run["tool_calls"] == 5
    assert run["agent"] == "looper"
    assert run["receipt"]["reason"] == "loop_detected"
    assert [v["verdict"] for v in run["verdicts"]] == ["stuck"]
    # Digests only: the query text is nowhere in what the service stored.
    assert "refund policy" not in json.dumps(run)


def test_json_encoding_and_gzip(service: Running) -> None:
    spans = loop_spans(4)
    body = gzip.compress(json_body(spans))
    got = httpx.post(
        f"{service.url}/v1/traces", content=body, headers=_auth({**JS, "Content-Encoding": "gzip"})
    )
    assert got.status_code == 200, got.text
    assert got.headers["content-type"].startswith("application/json")
    assert got.json() == {}
    run = _wait_run(service, trace_id_of(spans), status="ended")
    assert run["verdict"] == "stuck"
    assert run["tool_calls"] == 4


def test_a_gzip_body_of_several_members_is_read_whole_and_a_truncated_one_is_refused(service: Running) -> None:
    import zlib

    spans = loop_spans(5)
    body = protobuf_body(spans)
    half = len(body) // 2
    members = gzip.compress(body[:half]) + b"\0\0" + gzip.compress(body[half:])  # as concatenated .gz files
    headers = _auth({**PB, "Content-Encoding": "gzip"})
    got = httpx.post(f"{service.url}/v1/traces", content=members, headers=headers)
    assert got.status_code == 200, got.text
    run = _wait_run(service, trace_id_of(spans), status="ended")
    assert (run["tool_calls"], run["verdict"]) == (5, "stuck")
    for broken, encoding in (
        (gzip.compress(body)[:-12], "gzip"),  # cut inside the stream
        (gzip.compress(body) + b"not gzip", "gzip"),
        (zlib.compress(body) + b"more", "deflate"),
    ):
        refused = httpx.post(f"{service.url}/v1/traces", content=broken, headers=_auth({**PB, "Content-Encoding": encoding}))
        assert refused.status_code == 400, (encoding, refused.text)


def test_a_body_of_too_many_gzip_members_is_refused_and_a_padded_one_read_whole(service: Running) -> None:
    from tripwire.spans.otlp import MAX_GZIP_MEMBERS

    spans = loop_spans(5)
    body = protobuf_body(spans)
    empty = gzip.compress(b"", mtime=0)
    headers = _auth({**PB, "Content-Encoding": "gzip"})
    # Empty members (what once froze the receiver, quadratic in their number) up to the cap,
    # and zero padding between them, around the real request: read whole.
    padded = (empty + b"\0" * 300) * (MAX_GZIP_MEMBERS - 2) + gzip.compress(body) + empty
    got = httpx.post(f"{service.url}/v1/traces", content=padded, headers=headers)
    assert got.status_code == 200, got.text
    assert _wait_run(service, trace_id_of(spans), status="ended")["tool_calls"] == 5
    # One member more than the cap: a 400 that says why, and the receiver answers on.
    refused = httpx.post(f"{service.url}/v1/traces", content=empty * (MAX_GZIP_MEMBERS + 1), headers=headers)
    assert refused.status_code == 400
    assert f"more than {MAX_GZIP_MEMBERS} gzip members" in refused.text
    assert httpx.get(f"{service.url}/healthz").status_code == 200


def test_protobuf_answer_is_an_export_response(service: Running) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    got = httpx.post(
        f"{service.url}/v1/traces", content=protobuf_body(loop_spans(2)), headers=_auth(PB)
    )
    assert got.status_code == 200
    response = ExportTraceServiceResponse()
    response.ParseFromString(got.content)
    assert not response.HasField("partial_success")


def test_spans_of_one_trace_in_several_requests_out_of_order(sqlite_store: RunStore) -> None:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.3, flush_s=0.05)
    spans = loop_spans(5)
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    root = [s for s in spans if not s.name.startswith("execute_tool")]
    with running_service(config, sqlite_store) as r:
        # The 4th and 5th calls arrive first, then the first three, then the root.
        for part in (tools[3:], tools[:3], root):
            got = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(part), headers=_auth(PB))
            assert got.status_code == 200
        run = _wait_run(r, trace_id_of(spans), status="ended")
    # Judged in start-time order: stuck at the 4th call, as if the spans had come in order.
    assert run["first_stuck_call"] == 4
    assert [c["call_index"] for c in run["calls"]] == [1, 2, 3, 4, 5]


def test_partial_success_names_rejected_spans(service: Running) -> None:
    spans = loop_spans(2)
    message = json.loads(json_body(spans))
    message["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz"
    got = httpx.post(f"{service.url}/v1/traces", content=json.dumps(message), headers=_auth(JS))
    assert got.status_code == 200
    partial = got.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1"
    assert "traceId" in partial["errorMessage"]


def test_a_protobuf_span_with_invalid_utf8_is_rejected_alone(service: Running) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    req = ExportTraceServiceRequest.FromString(protobuf_body(loop_spans(3)))
    spans = req.resource_spans[0].scope_spans[0].spans
    before = len(spans)
    spans[0].name = "MARK"
    body = req.SerializeToString().replace(b"MARK", b"\xffAR\xfe")
    got = httpx.post(f"{service.url}/v1/traces", content=body, headers=_auth(PB))
    assert got.status_code == 200
    response = ExportTraceServiceResponse.FromString(got.content)
    assert response.partial_success.rejected_spans == 1 and before > 1
    assert "UTF-8" in response.partial_success.error_message


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"\x00\x01not protobuf\xff", PB),
        (b"{not json", JS),
        (b"[1, 2, 3]", JS),
        (b"\x1f\x8b\x08garbage", {**PB, "Content-Encoding": "gzip"}),
    ],
)
def test_malformed_payload_is_400_with_a_status(service: Running, body: bytes, headers: dict[str, str]) -> None:
    got = httpx.post(f"{service.url}/v1/traces", content=body, headers=_auth(headers))
    assert got.status_code == 400
    if headers["Content-Type"] == "application/json":
        assert got.json()["code"] == 3
        assert got.json()["message"]


def test_unsupported_content_type_is_415(service: Running) -> None:
    got = httpx.post(f"{service.url}/v1/traces", content=b"x", headers=_auth({"Content-Type": "text/plain"}))
    assert got.status_code == 415


def test_oversized_body_is_413_before_and_after_gzip(sqlite_store: RunStore) -> None:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, max_body_bytes=64 * 1024)
    with running_service(config, sqlite_store) as r:
        big = b"x" * (65 * 1024)
        got = httpx.post(f"{r.url}/v1/traces", content=big, headers=_auth(PB))
        assert got.status_code == 413
        bomb = gzip.compress(b"\x00" * (10 * 1024 * 1024))
        assert len(bomb) < 64 * 1024
        got = httpx.post(
            f"{r.url}/v1/traces", content=bomb, headers=_auth({**PB, "Content-Encoding": "gzip"})
        )
        assert got.status_code == 413
        # The service is still fine afterwards.
        ok = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(1)), headers=_auth(PB))
        assert ok.status_code == 200


def test_saturated_receiver_answers_503_with_retry_after(sqlite_store: RunStore) -> None:
    # A reorder buffer that holds spans for a minute and takes at most 10 of them.
    config = ServeConfig(tokens=(TOKEN,), reorder_s=60.0, max_buffered_spans=10)
    with running_service(config, sqlite_store) as r:
        first = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(12)), headers=_auth(PB))
        assert first.status_code == 200
        second = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(2)), headers=_auth(PB))
        assert second.status_code == 503
        assert second.headers["Retry-After"] == "1"


def test_every_endpoint_but_healthz_needs_the_token(service: Running) -> None:
    assert httpx.get(f"{service.url}/healthz").status_code == 200
    for method, path in (
        ("POST", "/v1/traces"),
        ("GET", "/api/runs"),
        ("GET", "/api/runs/" + "a" * 32),
        ("POST", "/api/runs/" + "a" * 32 + "/kill"),
        ("GET", "/metrics"),
        ("GET", "/api/flags/" + "a" * 32),
    ):
        got = httpx.request(method, service.url + path, headers={"Authorization": "Bearer wrong-token-xxxxxxxx", **PB})
        assert got.status_code == 401, path
        got = httpx.request(method, service.url + path, headers=PB)
        assert got.status_code == 401, path


def test_readyz_reports_the_store(service: Running) -> None:
    got = httpx.get(f"{service.url}/readyz")
    assert got.status_code == 200
    assert got.json() == {"status": "ready", "store": True, "kill_channel": True, "started": True}


def test_metrics_count_spans_transitions_and_runs(service: Running) -> None:
    httpx.post(f"{service.url}/v1/traces", content=protobuf_body(loop_spans(5)), headers=_auth(PB))
    httpx.post(f"{service.url}/v1/traces", content=b"junk", headers=_auth(PB))
    text = httpx.get(f"{service.url}/metrics", headers=service.headers()).text
    assert "tripwire_spans_received_total 6.0" in text
    assert 'tripwire_verdict_transitions_total{rule="repetition",verdict="stuck"} 1.0' in text
    assert 'tripwire_runs_total{stop_reason="loop_detected"} 1.0' in text
    assert 'tripwire_requests_total{code="400"} 1.0' in text
    assert "tripwire_tool_calls_judged_total 5.0" in text
    assert "tripwire_processing_seconds_bucket" in text


def test_the_runs_api_filters_by_verdict_and_refuses_a_query_no_run_can_match(service: Running) -> None:
    stuck, working = loop_spans(5), loop_spans(2, agent="fine")
    for spans in (stuck, working):
        httpx.post(f"{service.url}/v1/traces", content=protobuf_body(spans), headers=_auth(PB))
    _wait_run(service, trace_id_of(stuck), status="ended")
    _wait_run(service, trace_id_of(working), status="ended")

    def get(query: str) -> httpx.Response:
        return httpx.get(f"{service.url}/api/runs?{query}", headers=service.headers())

    body = get("verdict=stuck").json()
    assert [r["trace_id"] for r in body["runs"]] == [trace_id_of(stuck)]
    assert body["total"] == 1
    assert [r["trace_id"] for r in get("verdict=working").json()["runs"]] == [trace_id_of(working)]
    # Empty values are no filter: docs/serve.md's example query, as written.
    example = get("verdict=stuck&agent=&stop_reason=&health=&status=&since=7d&limit=50&offset=0")
    assert [r["trace_id"] for r in example.json()["runs"]] == [trace_id_of(stuck)]
    page = get("status=ended&limit=1").json()
    assert (len(page["runs"]), page["total"], page["limit"]) == (1, 2, 1)

    # A typo or an impossible page is a 400 naming the parameter, not an empty list.
    for query, field in (
        ("verdict=stuk", "verdict"),
        ("status=done", "status"),
        ("stop_reason=loop", "stop_reason"),
        ("health=bad", "health"),
        ("limit=0", "limit"),
        ("limit=-5", "limit"),
        ("limit=5000", "limit"),
        ("limit=ten", "limit"),
        ("offset=-1", "offset"),
        ("offset=9223372036854775808", "offset"),  # over SQLite's integers: it was a 500
        ("since=yesterday", "since"),
        ("since=nan", "since"),
    ):
        got = get(query)
        assert got.status_code == 400, query
        assert got.json()["detail"].startswith(f"{field}: "), got.json()
    assert "stuck" in get("verdict=stuk").json()["detail"]  # the choices are listed
    assert get("offset=1000000").json()["runs"] == []  # past the end: an empty page



def test_a_span_sent_after_its_runs_root_leaves_the_ended_run_and_its_receipt_as_they_were(sqlite_store: RunStore) -> None:
    # A tool ran in another process whose exporter sent its span after the agent's root was
    # judged. Applied, it started the run afresh, and a quiet second later (the idle TTL here)
    # its end wrote a half-run over the row: no agent, one call, another receipt.
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, idle_ttl_s=1.0)
    with running_service(config, sqlite_store) as service:
        first, late, root = loop_spans(2, agent="fine")
        tid = trace_id_of([root])
        post = {"headers": _auth(PB), "timeout": 10}
        assert httpx.post(f"{service.url}/v1/traces", content=protobuf_body([first, root]), **post).status_code == 200
        ended = _wait_run(service, tid, status="ended")
        assert (ended["agent"], ended["tool_calls"]) == ("fine", 1)
        assert httpx.post(f"{service.url}/v1/traces", content=protobuf_body([late]), **post).status_code == 200
        time.sleep(2.5)  # past the idle TTL: a run the late span had started would have ended
        text = httpx.get(f"{service.url}/metrics", headers=service.headers()).text
        assert "tripwire_spans_late_total 1.0" in text
        after = httpx.get(f"{service.url}/api/runs/{tid}", headers=service.headers()).json()
        keys = ("agent", "tool_calls", "status", "updated_at", "receipt")
        assert {k: after[k] for k in keys} == {k: ended[k] for k in keys}


def test_a_run_that_went_quiet_and_comes_back_is_running_again_in_its_row_until_its_root_ends_it(sqlite_store: RunStore) -> None:
    # An agent waited for a person past the idle TTL, so its run was recorded as ended (gone
    # quiet). Its next call went on counting, but the row kept saying "ended" with the quiet
    # receipt: the store would not turn an ended row back into a running one.
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, idle_ttl_s=2.0)
    with running_service(config, sqlite_store) as service:
        first, second, root = loop_spans(2, agent="waiter")
        tid = trace_id_of([root])
        post = {"headers": _auth(PB), "timeout": 10}
        assert httpx.post(f"{service.url}/v1/traces", content=protobuf_body([first]), **post).status_code == 200
        quiet = _wait_run(service, tid, status="ended")
        assert quiet["receipt"]["end"] is None and quiet["tool_calls"] == 1
        assert httpx.post(f"{service.url}/v1/traces", content=protobuf_body([second]), **post).status_code == 200
        back = _wait_run(service, tid, tool_calls=2)
        assert (back["status"], back["receipt"], back["ended_at"]) == ("running", None, None)
        assert httpx.post(f"{service.url}/v1/traces", content=protobuf_body([root]), **post).status_code == 200
        done = _wait_run(service, tid, status="ended", tool_calls=2)
        assert (done["agent"], done["receipt"]["reason"]) == ("waiter", "completed")


def test_after_a_restart_the_runs_that_ended_lately_are_known_as_ended(sqlite_store: RunStore) -> None:
    # The second receiver did not end these runs itself: it knows them from the store. A late
    # span of the run its root ended is left out; the run that went quiet goes on from its row.
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, idle_ttl_s=2.0, spool_dir=None)
    post = {"headers": _auth(PB), "timeout": 10}
    quiet_first, quiet_second, quiet_root = loop_spans(2, agent="waiter")
    finished_first, finished_late, finished_root = loop_spans(2, agent="fine")
    quiet_id, finished_id = trace_id_of([quiet_root]), trace_id_of([finished_root])
    with running_service(config, sqlite_store) as first:
        assert httpx.post(f"{first.url}/v1/traces", content=protobuf_body([quiet_first]), **post).status_code == 200
        _wait_run(first, quiet_id, status="ended")  # went quiet (2 s)
        assert httpx.post(f"{first.url}/v1/traces", content=protobuf_body([finished_first, finished_root]), **post).status_code == 200
        ended = _wait_run(first, finished_id, status="ended")
    with running_service(config, sqlite_store) as second:
        assert httpx.post(f"{second.url}/v1/traces", content=protobuf_body([finished_late]), **post).status_code == 200
        assert httpx.post(f"{second.url}/v1/traces", content=protobuf_body([quiet_second, quiet_root]), **post).status_code == 200
        back = _wait_run(second, quiet_id, tool_calls=2)
        assert back["agent"] == "waiter" and back["receipt"]["reason"] == "completed"
        assert [c["call_index"] for c in back["calls"]] == [1, 2]
        text = httpx.get(f"{second.url}/metrics", headers=second.headers()).text
        assert "tripwire_spans_late_total 1.0" in text
        after = httpx.get(f"{second.url}/api/runs/{finished_id}", headers=second.headers()).json()
        assert (after["tool_calls"], after["receipt"]) == (1, ended["receipt"])


def test_a_client_that_hangs_up_mid_body_is_no_server_error(service: Running, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    host, port = service.url.removeprefix("http://").split(":")
    uvicorn_log = logging.getLogger("uvicorn.error")  # it does not propagate to the root logger
    uvicorn_log.addHandler(caplog.handler)
    try:
        _hang_up_mid_body(service, host, int(port), caplog)
    finally:
        uvicorn_log.removeHandler(caplog.handler)
    tracebacks = [r for r in caplog.records if "Exception in ASGI application" in r.getMessage() or r.exc_info]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def _hang_up_mid_body(service: Running, host: str, port: int, caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import socket

    with caplog.at_level(logging.ERROR):
        for _ in range(3):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(
                b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 5000\r\n\r\n".encode() + b"\x0a" * 100
            )
            s.close()  # gone mid-body
        time.sleep(0.5)
        assert httpx.get(f"{service.url}/healthz").status_code == 200
