"""The protobuf wire scanner of OTLP requests: the Python twin (``tripwire.spans._wire``) against
``opentelemetry-proto`` on valid requests, and the compiled scanner (``_otlpscan.c``) against
the twin on valid, broken and hostile ones: identical output, or the same error.

Under ``CI=true`` the compiled scanner must be built; locally its half skips, loudly, when it
was not (or when ``TRIPWIRE_NO_EXTENSIONS`` is set).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.errors import InputError
from tripwire.spans import _wire
from tripwire.spans.otlp import _KEY_BYTES, _PREFIX_BYTES, MAX_DEPTH, decode_protobuf

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")
common = pytest.importorskip("opentelemetry.proto.common.v1.common_pb2")

try:
    from tripwire.spans import _otlpscan
except ImportError:  # pragma: no cover - depends on the build
    _otlpscan = None  # type: ignore[assignment]

_NO_EXT = os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0")
if _otlpscan is None and not _NO_EXT and os.environ.get("CI", "").lower() == "true":
    raise RuntimeError("tripwire.spans._otlpscan was not built: the install must compile it")
needs_c = pytest.mark.skipif(
    _otlpscan is None or _NO_EXT,
    reason="SKIPPED LOUDLY: the compiled OTLP scanner is not built or TRIPWIRE_NO_EXTENSIONS is set",
)


def scan_py(data: bytes) -> Any:
    return _outcome(_wire.scan, data)


def scan_c(data: bytes) -> Any:
    assert _otlpscan is not None
    return _outcome(_otlpscan.scan, data)


def _outcome(fn: Any, data: bytes) -> Any:
    try:
        return fn(data, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    except ValueError as exc:
        return ("ValueError", str(exc))


# -- the reference: the same rules, on the message opentelemetry-proto decoded ----------------


def _wanted(key: str) -> bool:
    return key.encode().startswith(_PREFIX_BYTES) or key.encode() in _KEY_BYTES


def _ref_value(v: Any, depth: int, cut: list[int]) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        if depth >= MAX_DEPTH:
            cut[0] += 1
            return None
        if kind == "array_value":
            return tuple(_ref_value(x, depth + 1, cut) for x in v.array_value.values)
        return {kv.key: _ref_value(kv.value, depth + 1, cut) if kv.HasField("value") else None
                for kv in v.kvlist_value.values}  # fmt: skip
    return getattr(v, kind)


def _ref_attrs(kvs: Any, cut: list[int]) -> dict[str, Any]:
    return {kv.key: _ref_value(kv.value, 0, cut) if kv.HasField("value") else None
            for kv in kvs if _wanted(kv.key)}  # fmt: skip


def reference(data: bytes) -> Any:
    req = pb.ExportTraceServiceRequest.FromString(data)
    cut = [0]
    out: list[Any] = []
    for rs in req.resource_spans:
        resource = _ref_attrs(rs.resource.attributes, cut) if rs.HasField("resource") else None
        for ss in rs.scope_spans:
            scope = (ss.scope.name or None) if ss.HasField("scope") else None
            for sp in ss.spans:
                if len(sp.trace_id) != 16 or sp.trace_id == bytes(16) or len(sp.span_id) not in (0, 8) or sp.span_id == bytes(8):
                    out.append(_wire.BAD_IDS)
                    continue
                failed = sp.status.code == 2
                exc = None
                for ev in sp.events:
                    if ev.name == "exception":
                        for kv in ev.attributes:
                            if kv.key == "exception.type":
                                if kv.value.WhichOneof("value") == "string_value":
                                    exc = kv.value.string_value or None
                                break
                        break
                parent = sp.parent_span_id
                out.append((
                    sp.trace_id.hex(),
                    sp.span_id.hex(),
                    parent.hex() if len(parent) == 8 and parent != bytes(8) else None,
                    sp.name,
                    sp.start_time_unix_nano / 1e9 if sp.start_time_unix_nano else None,
                    sp.end_time_unix_nano / 1e9 if sp.end_time_unix_nano else None,
                    failed,
                    sp.status.message or None,
                    exc if failed else None,
                    _ref_attrs(sp.attributes, cut),
                    resource,
                    scope,
                ))  # fmt: skip
    return out, cut[0]


# -- random requests -------------------------------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_keys = st.one_of(
    st.sampled_from(["gen_ai.tool.name", "gen_ai.tool.call.arguments", "metadata", "service.name",
                     "exception.type", "http.method", "tool_arguments", "input.value", "x"]),
    _text,
)  # fmt: skip


def _any_value(depth: int) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.builds(lambda s: common.AnyValue(string_value=s), _text),
        st.builds(lambda i: common.AnyValue(int_value=i), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda b: common.AnyValue(bool_value=b), st.booleans()),
        st.builds(lambda d: common.AnyValue(double_value=d), st.floats(allow_nan=False)),
        st.builds(lambda b: common.AnyValue(bytes_value=b), st.binary(max_size=8)),
        st.just(common.AnyValue()),
    )
    if depth <= 0:
        return scalars
    inner = _any_value(depth - 1)
    return st.one_of(
        scalars,
        st.builds(lambda vs: common.AnyValue(array_value=common.ArrayValue(values=vs)),
                  st.lists(inner, max_size=3)),
        st.builds(lambda kvs: common.AnyValue(kvlist_value=common.KeyValueList(
            values=[common.KeyValue(key=k, value=v) for k, v in kvs])),
            st.lists(st.tuples(_keys, inner), max_size=3)),
    )  # fmt: skip


_attrs = st.lists(st.tuples(_keys, _any_value(3)), max_size=5)
_ids16 = st.one_of(st.binary(min_size=16, max_size=16), st.sampled_from([b"", bytes(16), b"\x01" * 15]))
_ids8 = st.one_of(st.binary(min_size=8, max_size=8), st.sampled_from([b"", bytes(8), b"\x01" * 9]))


@st.composite
def requests(draw: Any) -> bytes:
    req = pb.ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        if draw(st.booleans()):
            for k, v in draw(_attrs):
                rs.resource.attributes.add(key=k).value.CopyFrom(v)
            rs.resource.SetInParent()
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            if draw(st.booleans()):
                ss.scope.name = draw(_text)
                ss.scope.version = draw(_text)
            for _ in range(draw(st.integers(0, 3))):
                sp = ss.spans.add()
                sp.trace_id = draw(_ids16)
                sp.span_id = draw(_ids8)
                sp.parent_span_id = draw(_ids8)
                sp.name = draw(_text)
                sp.trace_state = draw(_text)
                sp.kind = draw(st.integers(0, 5))
                sp.start_time_unix_nano = draw(st.integers(0, 2**64 - 1))
                sp.end_time_unix_nano = draw(st.integers(0, 2**64 - 1))
                for k, v in draw(_attrs):
                    sp.attributes.add(key=k).value.CopyFrom(v)
                for _ in range(draw(st.integers(0, 2))):
                    ev = sp.events.add()
                    ev.name = draw(st.sampled_from(["exception", "log", ""]))
                    ev.time_unix_nano = draw(st.integers(0, 2**64 - 1))
                    for k, v in draw(st.lists(st.tuples(st.sampled_from(["exception.type", "exception.message", "x"]), _any_value(1)), max_size=3)):
                        ev.attributes.add(key=k).value.CopyFrom(v)
                if draw(st.booleans()):
                    link = sp.links.add()
                    link.trace_id = draw(_ids16)
                    link.trace_state = draw(_text)
                if draw(st.booleans()):
                    sp.status.code = draw(st.integers(0, 2))
                    sp.status.message = draw(_text)
    return bytes(req.SerializeToString())


_SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


@given(requests())
@_SETTINGS
def test_python_scanner_reads_what_opentelemetry_proto_decodes(data: bytes) -> None:
    assert scan_py(data) == reference(data)


def _mutations(data: bytes, draw: Any) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "unknown", "huge"]))
    if not data:
        return draw(st.binary(max_size=40))
    at = draw(st.integers(0, len(data)))
    if kind == "truncate":
        return data[:at]
    if kind == "flip":
        i = min(at, len(data) - 1)
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    if kind == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=12)) + data[at:]
    if kind == "unknown":  # an unknown field of every wire type at the top level
        field = draw(st.integers(2, 2**29 - 1))
        wt = draw(st.sampled_from([0, 1, 2, 5]))
        tag = _varint(field << 3 | wt)
        body = {0: _varint(draw(st.integers(0, 2**64 - 1))), 1: bytes(8), 5: bytes(4),
                2: _varint(3) + b"abc"}[wt]  # fmt: skip
        return data + tag + body
    return data + b"\x0a" + b"\xff" * 9 + b"\x01"  # a length of 2**64 - 1


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@needs_c
@given(requests())
@_SETTINGS
def test_compiled_scanner_matches_on_valid_requests(data: bytes) -> None:
    assert scan_c(data) == scan_py(data)


@needs_c
@given(requests(), st.data())
@_SETTINGS
def test_compiled_scanner_matches_on_broken_requests(data: bytes, more: Any) -> None:
    broken = _mutations(data, more.draw)
    assert scan_c(broken) == scan_py(broken)


@needs_c
@given(st.binary(max_size=200))
@_SETTINGS
def test_compiled_scanner_matches_on_random_bytes(data: bytes) -> None:
    assert scan_c(data) == scan_py(data)



@needs_c
def test_the_keys_a_request_repeats_are_read_once_and_shared_and_read_as_before() -> None:
    # The compiled scanner remembers, per request, each attribute key it met (at most 32) and
    # whether it is wanted, and the trace and parent ids it met: more keys than that, keys in
    # and out of the wanted set, a wanted key with bad UTF-8 (its spans are rejected each
    # time), all read as the Python twin reads.
    def request(keys: list[str], n: int) -> bytes:
        req = pb.ExportTraceServiceRequest()
        spans = req.resource_spans.add().scope_spans.add()
        for i in range(n):
            sp = spans.spans.add()
            sp.trace_id = b"\x01" * 16
            sp.span_id = bytes([0] * 7 + [i + 1])
            sp.parent_span_id = b"\x09" * 8
            sp.name = "execute_tool t"
            for k, key in enumerate(keys):
                if key != "gen_ai.MARK" or i % 2:
                    sp.attributes.add(key=key).value.string_value = f"v{i}.{k}"
        return req.SerializeToString().replace(b"MARK", b"\xff\xfe\xfd\xfc")

    many = request([f"gen_ai.k{k:02}" if k % 3 else f"other.k{k:02}" for k in range(45)], 2)
    bad = request(["gen_ai.tool.name", "gen_ai.MARK", "thread.id"], 4)  # spans 1 and 3 bad
    for data in (many, bad):
        assert scan_c(data) == scan_py(data)
    entries, _cut = _otlpscan.scan(bad, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    assert [type(e) is tuple for e in entries] == [True, False, True, False]
    entries, _cut = _otlpscan.scan(many, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    # One str per trace id and per parent id in a request, as for keys.
    assert entries[0][0] is entries[1][0] and entries[0][2] is entries[1][2]
    assert entries[0][0] == "01" * 16 and entries[1][2] == "09" * 8
    first, second = (list(e[9]) for e in entries)
    assert first == second and len(first) == 30  # the 30 gen_ai. keys of the 45
    # Ids that take the same slot (the same last byte) are told apart.
    req = pb.ExportTraceServiceRequest()
    spans = req.resource_spans.add().scope_spans.add()
    for i in range(6):
        sp = spans.spans.add()
        sp.trace_id = bytes([i % 3 + 1]) + b"\x00" * 14 + b"\x07"
        sp.span_id = bytes([0] * 7 + [i + 1])
        sp.parent_span_id = bytes([i % 2 + 1]) + b"\x00" * 6 + b"\x07"
        sp.name = "t"
    data = req.SerializeToString()
    assert scan_c(data) == scan_py(data)
    entries, _cut = _otlpscan.scan(data, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    assert [(e[0][:2], e[2][:2]) for e in entries] == [("01", "01"), ("02", "02"), ("03", "01"),
                                                        ("01", "02"), ("02", "01"), ("03", "02")]  # fmt: skip
    # The 32 keys met first (21 of them wanted) are one str in every span's dict; the rest are
    # read anew for each span.
    shared = [a is b for a, b in zip(first, second, strict=True)]
    assert shared[:21] == [True] * 21 and not any(shared[21:])


# -- the decoder's contract on hand-made cases (both scanners: the suite runs both ways) -----


def _one_span(name: str = "execute_tool t", attrs: dict[str, Any] | None = None) -> Any:
    req = pb.ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id = b"\x01" * 16
    sp.span_id = b"\x02" * 8
    sp.name = name
    for k, v in (attrs or {}).items():
        sp.attributes.add(key=k).value.string_value = v
    return req


def test_a_span_with_bad_utf8_is_rejected_alone() -> None:
    req = _one_span()
    good = req.resource_spans[0].scope_spans[0].spans.add()
    good.CopyFrom(req.resource_spans[0].scope_spans[0].spans[0])
    good.span_id = b"\x03" * 8
    req.resource_spans[0].scope_spans[0].spans[0].name = "MARK"
    data = req.SerializeToString().replace(b"MARK", b"\xffAR\xfe")
    decoded = decode_protobuf(data)
    assert [v.span_id for v in decoded.views] == ["03" * 8]
    assert decoded.rejected == 1 and "invalid UTF-8" in decoded.message


def test_bad_utf8_in_an_attribute_not_read_is_no_error() -> None:
    data = _one_span(attrs={"http.url": "MARK"}).SerializeToString().replace(b"MARK", b"\xff\xfe\xfd\xfc")
    decoded = decode_protobuf(data)
    assert decoded.rejected == 0 and decoded.views[0].attributes == {}


def test_truncated_request_is_an_input_error() -> None:
    data = _one_span(attrs={"gen_ai.tool.name": "t"}).SerializeToString()
    with pytest.raises(InputError, match="truncated"):
        decode_protobuf(data[:-3])


def test_depth_is_cut_and_counted() -> None:
    value = common.AnyValue(string_value="leaf")
    for _ in range(MAX_DEPTH + 5):
        value = common.AnyValue(array_value=common.ArrayValue(values=[value]))
    req = _one_span()
    req.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="gen_ai.deep").value.CopyFrom(value)
    decoded = decode_protobuf(req.SerializeToString())
    got = decoded.views[0].attributes["gen_ai.deep"]
    for _ in range(MAX_DEPTH):
        (got,) = got
    assert got is None and decoded.deep == 1
