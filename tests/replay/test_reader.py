"""The OTLP readers: formats, compression, and bad input reported without stopping the read."""

from __future__ import annotations

import base64
import gzip
import io
import json
import sys
from pathlib import Path

import pytest
from replay_otlp import agent_span, dumps, repeated, request, s, span_id, tool_span, trace_id

from tripwire.replay.reader import Problem, read_batches, read_bytes, read_spans


def _write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _read(*paths: Path | str) -> tuple[list, list[Problem]]:
    problems: list[Problem] = []
    spans = list(read_spans([str(p) for p in paths], problems))
    return spans, problems


def test_otlp_json_file(tmp_path: Path) -> None:
    f = _write(tmp_path / "a.json", dumps(request(repeated(1, 3))))
    spans, problems = _read(f)
    assert problems == []
    assert len(spans) == 4
    root, first = spans[0], spans[1]
    assert root.trace_id == "0" * 31 + "1"
    assert root.parent_span_id is None
    assert first.span_id == span_id(100)
    assert first.parent_span_id == span_id(1)
    assert first.name == "execute_tool search_docs"
    assert first.attributes["gen_ai.tool.name"] == "search_docs"
    assert json.loads(first.attributes["gen_ai.tool.call.arguments"]) == {"query": "refund policy"}
    assert first.start_s == pytest.approx(1_700_000_001.0)
    assert first.end_s == pytest.approx(1_700_000_001.1)
    assert first.resource_attributes == {"service.name": "svc"}
    assert first.scope_name == "test"


def test_attribute_value_kinds(tmp_path: Path) -> None:
    span = tool_span(1, 2, "t", None, at=1)
    span["attributes"] += [
        {"key": "gen_ai.i", "value": {"intValue": "42"}},
        {"key": "gen_ai.i2", "value": {"intValue": 7}},
        {"key": "gen_ai.d", "value": {"doubleValue": 1.5}},
        {"key": "gen_ai.nan", "value": {"doubleValue": "NaN"}},
        {"key": "gen_ai.b", "value": {"boolValue": False}},
        {"key": "gen_ai.arr", "value": {"arrayValue": {"values": [{"stringValue": "x"}, {"intValue": "1"}]}}},
        {"key": "gen_ai.kv", "value": {"kvlistValue": {"values": [s("k", "v")]}}},
        {"key": "gen_ai.bytes", "value": {"bytesValue": base64.b64encode(b"\x00\x01").decode()}},
        {"key": "gen_ai.empty", "value": {}},
        {"key": "http.method", "value": {"stringValue": "GET"}},
        {"key": "metadata", "value": {"stringValue": "{}"}},
    ]
    spans, problems = _read(_write(tmp_path / "a.json", dumps(request([span]))))
    assert problems == []
    a = spans[0].attributes
    assert a["gen_ai.i"] == 42 and a["gen_ai.i2"] == 7 and a["gen_ai.d"] == 1.5 and a["gen_ai.b"] is False
    assert a["gen_ai.nan"] != a["gen_ai.nan"]  # NaN
    assert a["gen_ai.arr"] == ("x", 1)
    assert a["gen_ai.kv"] == {"k": "v"}
    assert a["gen_ai.bytes"] == b"\x00\x01"
    assert a["gen_ai.empty"] is None
    # Only what the mapping reads is kept (its prefixes, and the few keys without one).
    assert "http.method" not in a and a["metadata"] == "{}"


def test_status_error_and_exception_type(tmp_path: Path) -> None:
    span = tool_span(1, 2, "t", {"a": 1}, at=1)
    span["status"] = {"code": 2, "message": "boom"}
    span["events"] = [{"name": "exception", "attributes": [s("exception.type", "TimeoutError")]}]
    other = tool_span(1, 3, "t", {"a": 1}, at=2)
    other["status"] = {"code": "STATUS_CODE_ERROR"}
    spans, _ = _read(_write(tmp_path / "a.json", dumps(request([span, other]))))
    assert spans[0].status_error and spans[0].exception_type == "TimeoutError"
    assert spans[0].status_message == "boom"
    assert spans[1].status_error and spans[1].exception_type is None


def test_base64_ids_as_message_to_json_writes_them(tmp_path: Path) -> None:
    span = tool_span(1, 2, "t", {"a": 1}, at=1)
    span["traceId"] = base64.b64encode(bytes.fromhex(trace_id(0xABC))).decode()
    span["spanId"] = base64.b64encode(bytes.fromhex(span_id(0xDEF))).decode()
    span["parentSpanId"] = base64.b64encode(bytes.fromhex(span_id(1))).decode()
    assert len(span["traceId"]) == 24
    spans, problems = _read(_write(tmp_path / "a.json", dumps(request([span]))))
    assert problems == []
    assert spans[0].trace_id == trace_id(0xABC)
    assert spans[0].span_id == span_id(0xDEF)
    assert spans[0].parent_span_id == span_id(1)


def test_protobuf_file_and_its_json_mapping(tmp_path: Path) -> None:
    from google.protobuf.json_format import MessageToJson
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.append(KeyValue(key="service.name", value=AnyValue(string_value="svc")))
    ss = rs.scope_spans.add()
    ss.scope.name = "pb"
    sp = ss.spans.add()
    sp.trace_id = bytes.fromhex(trace_id(5))
    sp.span_id = bytes.fromhex(span_id(6))
    sp.parent_span_id = bytes.fromhex(span_id(1))
    sp.name = "execute_tool fetch"
    sp.start_time_unix_nano = 2_000_000_000
    sp.end_time_unix_nano = 3_000_000_000
    sp.status.code = 2
    sp.attributes.append(KeyValue(key="gen_ai.tool.name", value=AnyValue(string_value="fetch")))
    sp.attributes.append(KeyValue(key="gen_ai.n", value=AnyValue(int_value=3)))
    sp.attributes.append(KeyValue(key="http.status_code", value=AnyValue(int_value=200)))
    pb = _write(tmp_path / "a.pb", req.SerializeToString())
    as_json = _write(tmp_path / "b.json", MessageToJson(req))  # base64 ids, intValue as string

    for path in (pb, as_json):
        spans, problems = _read(path)
        assert problems == [], path
        (view,) = spans
        assert view.trace_id == trace_id(5)
        assert view.span_id == span_id(6)
        assert view.parent_span_id == span_id(1)
        assert view.start_s == 2.0 and view.end_s == 3.0
        assert view.status_error
        assert view.attributes == {"gen_ai.tool.name": "fetch", "gen_ai.n": 3}
        assert view.resource_attributes == {"service.name": "svc"}
        assert view.scope_name == "pb"


def test_gzip_detected_by_magic_bytes_not_name(tmp_path: Path) -> None:
    body = dumps(request(repeated(1, 2))).encode()
    named = _write(tmp_path / "a.json.gz", gzip.compress(body))
    unnamed = _write(tmp_path / "b.json", gzip.compress(body))
    for path in (named, unnamed):
        spans, problems = _read(path)
        assert problems == [] and len(spans) == 3


def test_a_gzip_file_of_too_many_members_is_a_problem_that_says_so(tmp_path: Path) -> None:
    from tripwire.spans.otlp import MAX_GZIP_MEMBERS

    body = dumps(request(repeated(1, 2))).encode()
    empty = gzip.compress(b"", mtime=0)
    spans, problems = _read(_write(tmp_path / "ok.json.gz", empty * (MAX_GZIP_MEMBERS - 1) + gzip.compress(body)))
    assert problems == [] and len(spans) == 3
    spans, problems = _read(_write(tmp_path / "bomb.json.gz", empty * (MAX_GZIP_MEMBERS + 1)))
    assert spans == [] and len(problems) == 1
    assert f"more than {MAX_GZIP_MEMBERS} gzip members" in problems[0].detail


def test_gzip_jsonl(tmp_path: Path) -> None:
    lines = "\n".join(dumps(request(repeated(i, 1))) for i in (1, 2))
    spans, problems = _read(_write(tmp_path / "a.jsonl.gz", gzip.compress(lines.encode())))
    assert problems == []
    assert {v.trace_id for v in spans} == {trace_id(1), trace_id(2)}


def test_jsonl_with_a_bad_line_3(tmp_path: Path) -> None:
    lines = [dumps(request(repeated(1, 1))), dumps(request(repeated(2, 1))), '{"resourceSpans": [',
             "", dumps(request(repeated(4, 1)))]
    spans, problems = _read(_write(tmp_path / "a.jsonl", "\n".join(lines) + "\n"))
    assert {v.trace_id for v in spans} == {trace_id(1), trace_id(2), trace_id(4)}
    (p,) = problems
    assert p.source.endswith("a.jsonl") and p.line == 3 and not p.skipped
    assert "truncated" in p.detail


def test_jsonl_under_a_json_name(tmp_path: Path) -> None:
    lines = "\n".join(dumps(request(repeated(i, 1))) for i in (1, 2, 3))
    spans, problems = _read(_write(tmp_path / "a.json", lines))
    assert problems == [] and len({v.trace_id for v in spans}) == 3


def test_pretty_printed_json(tmp_path: Path) -> None:
    spans, problems = _read(_write(tmp_path / "a.json", json.dumps(request(repeated(1, 2)), indent=2)))
    assert problems == [] and len(spans) == 3


def test_truncated_file_is_a_problem_and_other_files_are_read(tmp_path: Path) -> None:
    body = dumps(request(repeated(1, 3)))
    bad = _write(tmp_path / "bad.json", body[: len(body) // 2])
    good = _write(tmp_path / "good.json", dumps(request(repeated(2, 2))))
    spans, problems = _read(bad, good)
    assert {v.trace_id for v in spans} == {trace_id(2)}
    (p,) = problems
    assert p.source == str(bad) and p.line is None
    assert "truncated" in p.detail


def test_truncated_pretty_printed_json_is_one_problem(tmp_path: Path) -> None:
    body = json.dumps(request(repeated(1, 3)), indent=2)
    spans, problems = _read(_write(tmp_path / "bad.json", body[:-40]))
    assert spans == [] and len(problems) == 1 and problems[0].line is None


def test_span_without_trace_id(tmp_path: Path) -> None:
    spans_in = repeated(1, 3)
    del spans_in[2]["traceId"]
    spans_in[3]["traceId"] = ""
    spans, problems = _read(_write(tmp_path / "a.json", dumps(request(spans_in))))
    assert len(spans) == 2  # the agent span and one tool span
    (p,) = problems
    assert p.source.endswith("a.json") and "2 span(s) without a trace id" in p.detail


def test_ids_that_are_neither_hex_nor_base64(tmp_path: Path) -> None:
    spans_in = repeated(1, 2)
    spans_in[1]["traceId"] = "not-an-id"
    spans, problems = _read(_write(tmp_path / "a.json", dumps(request(spans_in))))
    assert len(spans) == 2 and len(problems) == 1


def test_not_otlp_json_named_explicitly_is_an_error(tmp_path: Path) -> None:
    spans, problems = _read(_write(tmp_path / "labels.json", '{"file": "x", "label": "healthy"}'))
    assert spans == []
    (p,) = problems
    assert not p.skipped and "resourceSpans" in p.detail


def test_directory_walk_skips_non_otlp_with_a_note(tmp_path: Path) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    _write(tmp_path / "labels.jsonl", '{"file": "x", "label": "healthy"}\n')
    _write(tmp_path / "README.md", "# not traces")
    _write(tmp_path / ".hidden.json", "garbage")
    _write(sub / "b.json", dumps(request(repeated(2, 1))))
    _write(tmp_path / "a.json", dumps(request(repeated(1, 1))))
    batches = list(read_batches([tmp_path]))
    assert [Path(b.source).name for b in batches] == ["a.json", "labels.jsonl", "b.json"]
    assert [p.skipped for b in batches for p in b.problems] == [True]


def test_binary_that_is_not_otlp(tmp_path: Path) -> None:
    spans, problems = _read(_write(tmp_path / "a.pb", b"hello world, not protobuf"))
    assert spans == [] and "not OTLP" in problems[0].detail


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = gzip.compress(dumps(request(repeated(1, 3))).encode())
    spans, problems = _read(_write(tmp_path / "a.json.gz", data[:30]))
    assert spans == [] and "gzip" in problems[0].detail


def test_empty_and_missing_files(tmp_path: Path) -> None:
    spans, problems = _read(_write(tmp_path / "empty.json", b""), tmp_path / "nope.json")
    assert spans == []
    assert [p.detail for p in problems] == ["empty input (no OTLP data)", "no such file or directory"]


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    body = dumps(request(repeated(1, 2))).encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body)))
    spans, problems = _read("-")
    assert problems == [] and len(spans) == 3


def test_read_bytes_never_raises_on_wrong_types() -> None:
    batch = read_bytes(b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": 5}]}]}]}', "x.json")
    assert batch.spans == [] and "not an OTLP span" in batch.problems[0].detail


def test_old_instrumentation_library_spans_name() -> None:
    body = {"resourceSpans": [{"instrumentationLibrarySpans": [{"spans": [agent_span(1, 1, "a")]}]}]}
    batch = read_bytes(dumps(body).encode(), "old.json")
    assert batch.problems == [] and len(batch.spans) == 1


def test_problem_as_input_error() -> None:
    err = Problem("f.jsonl", "invalid JSON", 3).to_error()
    assert (err.source, err.line, err.detail) == ("f.jsonl", 3, "invalid JSON")
    assert str(Problem("f.jsonl", "bad", 3)) == "f.jsonl:3: bad"


# -- hostile input (issue 16): reported per file, every valid span kept, bounded -----------


def _one_bad_span(bad: dict) -> str:
    """A request of 3 good tool spans and one bad one (the 2nd)."""
    spans = repeated(1, 3)
    spans.insert(2, bad)
    return dumps(request(spans))


def _deep_array(levels: int) -> dict:
    value: dict = {"intValue": "1"}
    for _ in range(levels):
        value = {"arrayValue": {"values": [value]}}
    return value


def test_a_401_digit_start_time_is_reported_and_the_span_kept(tmp_path: Path) -> None:
    bad = tool_span(1, 500, "search_docs", json.dumps({"q": "x"}), at=9)
    bad["startTimeUnixNano"] = "9" * 401
    f = _write(tmp_path / "a.json", _one_bad_span(bad))
    spans, problems = _read(f)
    assert len(spans) == 5  # root + 3 + the one with the bad time
    assert [p.source for p in problems] == [str(f)]
    assert "not Unix times in nanoseconds" in problems[0].detail
    assert next(sp for sp in spans if sp.span_id == span_id(500)).start_s is None


def test_an_unquoted_401_digit_time_too(tmp_path: Path) -> None:
    bad = tool_span(1, 500, "search_docs", None, at=9)
    text = _one_bad_span(bad).replace(json.dumps(bad["startTimeUnixNano"]), "9" * 401, 1)
    spans, problems = _read(_write(tmp_path / "a.json", text))
    assert len(spans) == 5 and len(problems) == 1


def test_an_attribute_400_array_levels_deep_is_a_bad_file_not_a_crash(tmp_path: Path) -> None:
    bad = tool_span(1, 500, "search_docs", None, at=9)
    bad["attributes"].append({"key": "deep", "value": "MARK"})
    deep = '{"arrayValue": {"values": [' * 400 + '{"intValue": "1"}' + "]}}" * 400
    f = _write(tmp_path / "deep.json", _one_bad_span(bad).replace('"MARK"', deep))
    good = _write(tmp_path / "good.json", dumps(request(repeated(2, 3))))
    spans, problems = _read(f, good)
    assert [p.source for p in problems] == [str(f)]
    assert {sp.trace_id for sp in spans} == {trace_id(2)}  # the other file is kept


def test_an_attribute_40_levels_deep_is_cut_and_the_span_kept(tmp_path: Path) -> None:
    bad = tool_span(1, 500, "search_docs", None, at=9)
    bad["attributes"].append({"key": "gen_ai.deep", "value": _deep_array(40)})
    spans, problems = _read(_write(tmp_path / "a.json", _one_bad_span(bad)))
    assert len(spans) == 5
    assert "nested deeper than" in problems[0].detail


@pytest.mark.parametrize(
    ("raw", "reason"),
    [(b"\\ud800", "lone surrogate"), (b"\\udc00", "lone surrogate"), (b"\xff", "invalid UTF-8")],
)
def test_one_bad_string_loses_its_span_only(tmp_path: Path, raw: bytes, reason: str) -> None:
    bad = tool_span(1, 500, "search_docs", None, at=9)
    bad["attributes"].append(s("note", "MARK"))
    data = _one_bad_span(bad).encode().replace(b"MARK", raw)
    spans, problems = _read(_write(tmp_path / "a.json", data))
    assert len(spans) == 4 and span_id(500) not in {sp.span_id for sp in spans}
    assert len(problems) == 1 and reason in problems[0].detail


def test_a_surrogate_pair_is_not_a_lone_surrogate(tmp_path: Path) -> None:
    bad = tool_span(1, 500, "search_docs", None, at=9)
    bad["attributes"].append(s("note", "MARK"))
    data = _one_bad_span(bad).encode().replace(b"MARK", b"\\ud83d\\ude00")
    spans, problems = _read(_write(tmp_path / "a.json", data))
    assert problems == [] and len(spans) == 5


def test_a_bad_string_in_a_jsonl_line(tmp_path: Path) -> None:
    good = json.dumps(request(repeated(1, 2)))
    bad = json.dumps(request(repeated(2, 2))).replace("search_docs", "\\udfff", 1)
    f = _write(tmp_path / "a.jsonl", f"{good}\n{bad}\n")
    spans, problems = _read(f)
    assert {sp.trace_id for sp in spans} == {trace_id(1), trace_id(2)}
    assert problems[0].line == 2


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    f = _write(tmp_path / "bom.json", b"\xef\xbb\xbf" + dumps(request(repeated(1, 3))).encode())
    spans, problems = _read(f)
    assert problems == [] and len(spans) == 4


def test_a_gzip_bomb_stops_at_the_cap(tmp_path: Path) -> None:
    f = _write(tmp_path / "bomb.json.gz", gzip.compress(b" " * (8 << 20)))
    good = _write(tmp_path / "good.json", dumps(request(repeated(2, 3))))
    batches = list(read_batches([str(f), str(good)], max_file_bytes=1 << 20))
    assert batches[0].spans == [] and "decompresses to more than 1 MiB" in batches[0].problems[0].detail
    assert len(batches[1].spans) == 4
    # The same file under the default cap is simply empty JSON: the cap is what refused it.
    assert "decompresses" not in read_bytes(f.read_bytes(), str(f)).problems[0].detail


def test_multi_member_gzip_is_read_whole(tmp_path: Path) -> None:
    text = json.dumps(request(repeated(1, 2))) + "\n" + json.dumps(request(repeated(2, 2))) + "\n"
    half = len(text) // 2
    f = _write(tmp_path / "a.jsonl.gz", gzip.compress(text[:half].encode()) + gzip.compress(text[half:].encode()))
    spans, problems = _read(f)
    assert problems == [] and len(spans) == 6


def test_a_file_over_the_read_cap(tmp_path: Path) -> None:
    f = _write(tmp_path / "big.json", b" " * 4096 + dumps(request(repeated(1, 3))).encode())
    (batch,) = read_batches([str(f)], max_file_bytes=2048)
    assert batch.spans == [] and "over the cap" in batch.problems[0].detail


def test_a_symlink_to_dev_zero_and_a_fifo_are_skipped_and_reported(tmp_path: Path) -> None:
    import os

    (tmp_path / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(tmp_path / "pipe.json")  # reading it would wait forever for a writer
    _write(tmp_path / "good.json", dumps(request(repeated(1, 3))))
    batches = {Path(b.source).name: b for b in read_batches([str(tmp_path)])}
    assert len(batches["good.json"].spans) == 4
    for name, kind in (("zero.json", "a device"), ("pipe.json", "a FIFO")):
        (problem,) = batches[name].problems
        assert f"not a regular file ({kind})" in problem.detail and not problem.skipped
