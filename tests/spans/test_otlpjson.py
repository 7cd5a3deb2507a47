"""The compiled OTLP/JSON fast path (``_otlpjson.c``) against the msgspec decoder of
``tripwire.spans.otlp``, its twin: on every request it reads, the same spans as the decoder
(and a request the decoder would reject, count or recover in part, it never reads); on the
requests exporters send, it does read them: generated ones, and every trace of the labelled
corpus when it is at hand (``TRIPWIRE_CORPUS``, default ``../shared/corpus``; not in the
repository).

Under ``CI=true`` the fast path must be built; locally this file skips, loudly, when it was not
(or when ``TRIPWIRE_NO_EXTENSIONS`` is set: then the decoder alone is in use, and tested
everywhere else).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus_files import corpus_files
from tripwire.errors import InputError
from tripwire.spans import otlp
from tripwire.spans.otlp import (
    _KEY_BYTES,
    _PREFIX_BYTES,
    MAX_DEPTH,
    Decoded,
    DecodedSpan,
    decode_json,
)

try:
    from tripwire.spans import _otlpjson
except ImportError:  # pragma: no cover - depends on the build
    _otlpjson = None  # type: ignore[assignment]

if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
    pytest.skip("SKIPPED LOUDLY: TRIPWIRE_NO_EXTENSIONS is set, so the OTLP/JSON fast path is not "
                "in use; the msgspec decoder is tested by the rest of the suite",
                allow_module_level=True)  # fmt: skip
if _otlpjson is None:  # pragma: no cover - depends on the build
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError("tripwire.spans._otlpjson was not built: the install must compile it")
    pytest.skip("SKIPPED LOUDLY: the compiled OTLP/JSON fast path tripwire.spans._otlpjson is not "
                "built (pip install -e . needs a C compiler)", allow_module_level=True)  # fmt: skip


def fast(body: bytes) -> list[DecodedSpan] | None:
    assert _otlpjson is not None
    entries = _otlpjson.scan(body, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    return None if entries is None else [DecodedSpan(*e) for e in entries]


@contextmanager
def _decoder_only() -> Iterator[None]:
    saved = otlp._JSON_SCAN
    otlp._JSON_SCAN = None  # type: ignore[misc]
    try:
        yield
    finally:
        otlp._JSON_SCAN = saved  # type: ignore[misc]


def slow(body: bytes) -> Decoded | str:
    with _decoder_only():
        try:
            return decode_json(body)
        except InputError as exc:  # the decoder's one documented error
            return f"InputError: {exc}"


def check(body: bytes) -> list[DecodedSpan] | None:
    """The fast path reads ``body`` as the decoder does, or not at all."""
    got = fast(body)
    if got is not None:
        want = slow(body)
        assert isinstance(want, Decoded), want
        assert (want.rejected, want.bad_times, want.deep, want.envelope) == (0, 0, 0, True), want
        assert got == want.views
        # What decode_json returns is the fast path's.
        assert decode_json(body) == Decoded(views=got)
    return got


# -- requests as exporters write them, and as hostile ones do ---------------------------------

_text = st.text(max_size=12)
_keys = st.one_of(
    st.sampled_from(["gen_ai.tool.name", "gen_ai.tool.call.arguments", "metadata", "service.name",
                     "exception.type", "http.method", "tool_arguments", "input.value", "x", ""]),
    _text,
)  # fmt: skip


def _hex(n: int, upper: bool) -> st.SearchStrategy[str]:
    ids = st.binary(min_size=n, max_size=n).filter(any)  # an all-zero trace id is no id
    return ids.map(lambda b: b.hex().upper() if upper else b.hex())


_SCALARS = st.one_of(
    st.builds(lambda s: {"stringValue": s}, _text),
    st.builds(lambda i: {"intValue": i}, st.integers(-(10**18) + 1, 10**18 - 1)),
    st.builds(lambda i: {"intValue": str(i)}, st.integers(-(10**18) + 1, 10**18 - 1)),
    st.builds(lambda b: {"boolValue": b}, st.booleans()),
    st.builds(lambda d: {"doubleValue": d}, st.floats(allow_nan=False, allow_infinity=False)),
    st.builds(lambda i: {"doubleValue": i}, st.integers(-(10**15) + 1, 10**15 - 1)),
    st.just({}),
)
_ODD_SCALARS = st.one_of(  # what the fast path leaves to the decoder, or must read all the same
    st.builds(lambda b: {"bytesValue": base64.b64encode(b).decode()}, st.binary(max_size=6)),
    st.sampled_from([{"doubleValue": "NaN"}, {"doubleValue": "Infinity"}, {"intValue": 1.5},
                     {"intValue": "12x"}, {"intValue": 2**70}, {"intValue": str(2**70)},
                     {"stringValue": None}, {"stringValue": None, "intValue": 3},
                     {"stringValue": "a", "intValue": 3}, {"boolValue": 1},
                     {"stringValue": 5}, {"doubleValue": 10**17}, {"unknown": [1, {"a": None}]}]),
    st.none(),
)  # fmt: skip


@st.composite
def _any_value(draw: Any, depth: int, odd: bool) -> Any:
    if odd and draw(st.integers(0, 15)) == 0:
        return draw(_ODD_SCALARS)
    kind = draw(st.integers(0, 4)) if depth > 0 else 0
    if kind == 3:
        return {"arrayValue": {"values": draw(st.lists(_any_value(depth - 1, odd), max_size=3))}}
    if kind == 4:
        kvs = draw(st.lists(st.tuples(_keys, _any_value(depth - 1, odd)), max_size=3))
        return {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kvs]}}
    return draw(_SCALARS)


@st.composite
def _shuffled(draw: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with its keys in a drawn order (JSON members come in any order)."""
    items = draw(st.permutations(list(obj.items())))
    return dict(items)


@st.composite
def _kv(draw: Any, odd: bool, keys: st.SearchStrategy[str] = _keys) -> dict[str, Any]:
    kv: dict[str, Any] = {"key": draw(keys), "value": draw(_any_value(2, odd))}
    if draw(st.integers(0, 9)) == 0:
        del kv["value"]  # a key without a value
    return draw(_shuffled(kv))


@st.composite
def _span(draw: Any, odd: bool) -> dict[str, Any]:
    upper = draw(st.booleans())
    span: dict[str, Any] = {
        "traceId": draw(_hex(16, upper)),
        "spanId": draw(st.one_of(_hex(8, upper), st.just(""))),
        "name": draw(_text),
        "kind": draw(st.integers(0, 5)),
        "attributes": draw(st.lists(_kv(odd), max_size=5)),
    }
    if draw(st.booleans()):
        span["parentSpanId"] = draw(st.one_of(_hex(8, upper), st.just("")))
    for field in ("startTimeUnixNano", "endTimeUnixNano"):
        choice = draw(st.integers(0, 4))
        nanos = draw(st.integers(0, 2**63 - 1))
        if choice == 0:
            span[field] = nanos
        elif choice == 1:
            span[field] = str(nanos)
        elif choice == 2:
            span[field] = draw(st.sampled_from([0, "0", None]))
    if draw(st.booleans()):
        status: dict[str, Any] = {"code": draw(st.sampled_from([0, 1, 2, "2", "STATUS_CODE_ERROR", "STATUS_CODE_OK"]))}
        if draw(st.booleans()):
            status["message"] = draw(_text)
        span["status"] = draw(_shuffled(status))
    if draw(st.booleans()):
        span["events"] = [
            draw(_shuffled({"name": draw(st.sampled_from(["exception", "log", ""])), "timeUnixNano": "1",
                            "attributes": draw(st.lists(_kv(odd, st.sampled_from(["exception.type", "exception.message", "x"])), max_size=3))}))
            for _ in range(draw(st.integers(0, 2)))
        ]  # fmt: skip
    if draw(st.booleans()):
        span["links"] = [{"traceId": draw(_hex(16, False)), "attributes": []}]
    if odd:
        if draw(st.integers(0, 12)) == 0:
            span["traceId"] = draw(st.sampled_from([
                "", "0" * 32, base64.b64encode(bytes(range(16))).decode(), "xyz", "A" * 31]))  # fmt: skip
        if draw(st.integers(0, 15)) == 0:
            span["spanId"] = base64.b64encode(b"\x01" * 8).decode()
        if draw(st.integers(0, 15)) == 0:
            span["startTimeUnixNano"] = draw(st.sampled_from([-5, 1.5e18, "abc", "", " 12", "1_000", 2**64, str(2**70), True]))
        if draw(st.integers(0, 15)) == 0:
            span[draw(st.sampled_from(["name", "attributes", "events", "traceId"]))] = None
        if draw(st.integers(0, 15)) == 0:
            span["status"] = draw(st.sampled_from([None, {"code": 2.0}, {"code": True}, {"message": None, "code": 2}]))
    return draw(_shuffled(span))


@st.composite
def requests(draw: Any, odd: bool = False) -> bytes:
    resource_spans = []
    for _ in range(draw(st.integers(0, 2))):
        rs: dict[str, Any] = {}
        if draw(st.booleans()):
            rs["resource"] = {"attributes": draw(st.lists(_kv(odd), max_size=3)), "droppedAttributesCount": 0}
        scope_spans = []
        for _ in range(draw(st.integers(0, 2))):
            ss: dict[str, Any] = {"spans": draw(st.lists(_span(odd), max_size=3))}
            if draw(st.booleans()):
                ss["scope"] = {"name": draw(_text), "version": "1"}
            scope_spans.append(draw(_shuffled(ss)))
        rs[draw(st.sampled_from(["scopeSpans", "scopeSpans", "instrumentationLibrarySpans"]))] = scope_spans
        if draw(st.integers(0, 4)) == 0:
            rs["instrumentationLibrarySpans"] = [{"spans": draw(st.lists(_span(odd), max_size=2))}]
        resource_spans.append(draw(_shuffled(rs)))
    req: dict[str, Any] = {"resourceSpans": resource_spans}
    if odd and draw(st.integers(0, 6)) == 0:
        req = draw(st.sampled_from([{}, {"resourceSpans": None}, {"other": 1}]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    text = json.dumps(req, ensure_ascii=draw(st.booleans()), separators=separators,
                      indent=draw(st.sampled_from([None, None, 2])))  # fmt: skip
    return text.encode("utf-8", "surrogatepass")


_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@_SETTINGS
@given(requests())
def test_the_fast_path_reads_what_exporters_send_as_the_decoder_does(body: bytes) -> None:
    assert check(body) is not None


@_SETTINGS
@given(requests(odd=True))
def test_the_fast_path_reads_a_request_exactly_or_leaves_it_to_the_decoder(body: bytes) -> None:
    check(body)


_SIGNIFICANT = b'"{}[],:\\ 0-9eE.nultrf\x00\xff\xc3'


@_SETTINGS
@given(requests(), st.data())
def test_broken_requests_are_read_exactly_or_left_to_the_decoder(body: bytes, data: Any) -> None:
    mutated = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        if not mutated:
            break
        at = data.draw(st.integers(0, len(mutated) - 1))
        how = data.draw(st.integers(0, 3))
        if how == 0:
            del mutated[at:]
        elif how == 1:
            mutated[at] = data.draw(st.sampled_from(list(_SIGNIFICANT)))
        elif how == 2:
            mutated.insert(at, data.draw(st.sampled_from(list(_SIGNIFICANT))))
        else:
            end = data.draw(st.integers(at, min(len(mutated), at + 40)))
            mutated[at:at] = mutated[at:end]  # a stretch written twice
    check(bytes(mutated))


# -- cases worked by hand -----------------------------------------------------------------------

_TRACE = "5B8EFFF798038103D269B633813FC60C"
_SPAN = {
    "traceId": _TRACE,
    "spanId": "EEE19B7EC3C1B174",
    "parentSpanId": "EEE19B7EC3C1B173",
    "name": "execute_tool search",
    "startTimeUnixNano": "1700000000000000000",
    "endTimeUnixNano": 1700000000500000000,
    "attributes": [
        {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
        {"value": {"stringValue": "{\"q\": \"caf\u00e9 \U0001f600\"}"}, "key": "gen_ai.tool.call.arguments"},
        {"key": "http.method", "value": {"stringValue": "GET"}},
        {"key": "gen_ai.usage.input_tokens", "value": {"intValue": "12"}},
        {"key": "tool.tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}},
        {"key": "metadata", "value": {"kvlistValue": {"values": [{"key": "k", "value": {"doubleValue": 0.5}}]}}},
    ],
    "events": [
        {"name": "log", "attributes": [{"key": "exception.type", "value": {"stringValue": "NotThisOne"}}]},
        {"attributes": [{"key": "exception.type", "value": {"stringValue": "TimeoutError"}}], "name": "exception"},
    ],
    "status": {"message": "timed out", "code": "STATUS_CODE_ERROR"},
}  # fmt: skip


def _body(span: dict[str, Any], *, ensure_ascii: bool = True, resource_last: bool = False) -> bytes:
    rs: dict[str, Any] = {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
                          "scopeSpans": [{"scope": {"name": "s"}, "spans": [span]}]}  # fmt: skip
    if resource_last:
        rs = {"scopeSpans": rs["scopeSpans"], "resource": rs["resource"]}
    return json.dumps({"resourceSpans": [rs]}, ensure_ascii=ensure_ascii).encode()


@pytest.mark.parametrize("ensure_ascii", [True, False], ids=["escaped", "utf-8"])
@pytest.mark.parametrize("resource_last", [False, True], ids=["resource-first", "resource-last"])
def test_a_collector_span_reads_every_field(ensure_ascii: bool, resource_last: bool) -> None:
    got = check(_body(_SPAN, ensure_ascii=ensure_ascii, resource_last=resource_last))
    assert got is not None and len(got) == 1
    span = got[0]
    # Written by hand from _SPAN, not by either decoder.
    assert span.trace_id == _TRACE.lower() and span.span_id == "eee19b7ec3c1b174"
    assert span.parent_span_id == "eee19b7ec3c1b173"
    assert (span.start_s, span.end_s) == (1700000000.0, 1700000000.5)
    assert span.status_error is True and span.status_message == "timed out"
    assert span.exception_type == "TimeoutError"  # the first event named "exception"
    assert span.attributes == {
        "gen_ai.tool.name": "search",
        "gen_ai.tool.call.arguments": '{"q": "caf\u00e9 \U0001f600"}',
        "gen_ai.usage.input_tokens": 12,
        "tool.tags": ("a", True),
        "metadata": {"k": 0.5},
    }  # http.method is not read
    assert span.resource_attributes == {"service.name": "agent"} and span.scope_name == "s"


@pytest.mark.parametrize(
    "change",
    [
        {"traceId": base64.b64encode(bytes.fromhex(_TRACE)).decode()},  # base64 ids: the decoder's
        {"traceId": ""},  # a span without a trace id: counted by the decoder
        {"startTimeUnixNano": 1.7e18},  # not an integer: the decoder's recovery
        {"name": None},
        {"attributes": [None]},
        {"attributes": [{"key": "gen_ai.tool.name", "value": {"stringValue": "a", "intValue": 1}}]},
        {"attributes": [{"key": "gen_ai.x", "value": {"arrayValue": {"values": [None]}}}]},
        {"name": "\udc00"},  # a lone surrogate, written as \\udc00
    ],
    ids=["base64-id", "no-trace-id", "float-time", "null-name", "null-attribute", "two-values",
         "null-array-item", "lone-surrogate"],
)  # fmt: skip
def test_what_only_the_decoder_can_say_is_left_to_it(change: dict[str, Any]) -> None:
    body = _body({**_SPAN, **change})
    assert fast(body) is None
    want = slow(body)
    if isinstance(want, Decoded):  # decode_json answers it as the decoder does
        assert decode_json(body) == want
    else:
        with pytest.raises(InputError):
            decode_json(body)


def test_a_field_written_twice_is_left_to_the_decoder() -> None:
    body = _body(_SPAN).replace(b'"name": "execute_tool search"', b'"name": "a", "name": "b"')
    assert fast(body) is None


def test_trailing_data_and_a_missing_envelope_are_left_to_the_decoder() -> None:
    assert fast(_body(_SPAN) + b" x") is None
    assert fast(b'{"other": 1}') is None
    assert fast(_body(_SPAN) + b" \n") is not None


def test_values_nested_to_the_cut_are_left_to_the_decoder() -> None:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(MAX_DEPTH + 1):
        value = {"arrayValue": {"values": [value]}}
    body = _body({**_SPAN, "attributes": [{"key": "gen_ai.deep", "value": value}]})
    assert fast(body) is None
    decoded = slow(body)
    assert isinstance(decoded, Decoded) and decoded.deep == 1


# -- the corpus: real recorded traces ------------------------------------------------------------


def test_every_trace_of_the_corpus_is_read_by_the_fast_path_as_the_decoder_reads_it() -> None:
    read = [check(f.read_bytes()) for f in corpus_files()]
    assert all(views is not None for views in read)  # what real emitters wrote: all of it
    assert sum(len(v) for v in read if v is not None) > 0


def test_a_value_read_again_after_its_key_keeps_no_memory() -> None:
    # An attribute whose "value" comes before its "key" is read again once the key says it is
    # wanted; the names of a key-value list inside it were kept by a copy of the reader's
    # state and never released (about 6 KB a request here, for as long as the process ran).
    import gc
    import tracemalloc

    def body(i: int) -> bytes:
        values = [{"key": f"k{i}.{j}." + "x" * 200, "value": {"stringValue": "v"}} for j in range(20)]
        attribute = {"value": {"kvlistValue": {"values": values}}, "key": "gen_ai.tool.call.arguments"}
        span = {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "execute_tool t",
                "startTimeUnixNano": "1", "endTimeUnixNano": "2",
                "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}}, attribute]}  # fmt: skip
        request = {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}
        return json.dumps(request).encode()

    bodies = [body(i) for i in range(200)]
    got = check(bodies[0])
    assert got is not None and len(got[0].attributes["gen_ai.tool.call.arguments"]) == 20
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for b in bodies:
            fast(b)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000, grown


def test_the_ids_a_request_repeats_are_one_str_each_and_read_as_the_decoder_reads_them() -> None:
    # One str per trace id and parent id in a request; ids that take one slot (the same last
    # two characters), an id in upper case and an all-zero parent are told apart as before.
    def span(i: int, trace: str, parent: str) -> dict[str, Any]:
        return {"traceId": trace, "spanId": f"{i + 1:016x}", "parentSpanId": parent, "name": "t",
                "startTimeUnixNano": "1", "endTimeUnixNano": "2"}  # fmt: skip

    traces = ["01" + "0" * 28 + "07", "02" + "0" * 28 + "07", ("0A" + "0" * 28 + "07")]
    parents = ["01" + "0" * 12 + "07", "02" + "0" * 12 + "07", "0" * 16]
    spans = [span(i, traces[i % 3], parents[i % 2 if i < 6 else 2]) for i in range(8)]
    spans += [span(i, "f" * 32, "ab" * 8) for i in (8, 9)]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    got = check(body)
    assert got is not None
    assert [(v.trace_id[:2], v.parent_span_id and v.parent_span_id[:2]) for v in got] == [
        ("01", "01"), ("02", "02"), ("0a", "01"), ("01", "02"), ("02", "01"), ("0a", "02"),
        ("01", None), ("02", None), ("ff", "ab"), ("ff", "ab"),
    ]
    assert got[8].trace_id is got[9].trace_id and got[8].parent_span_id is got[9].parent_span_id
