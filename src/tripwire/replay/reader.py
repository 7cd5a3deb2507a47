"""OTLP trace files → :class:`~tripwire.otel.conventions.SpanView` objects.

Reads what OpenTelemetry exporters and the Collector write:

- OTLP/JSON: one ``ExportTraceServiceRequest`` per file, in the protobuf JSON mapping. Ids are
  hex strings (the OTLP file exporter) or base64 (protobuf's ``MessageToJson``); integers
  may be JSON strings; attribute values are ``{"stringValue": …}``, ``intValue``,
  ``doubleValue``, ``boolValue``, ``bytesValue``, ``arrayValue``, ``kvlistValue``;
- JSON Lines of those requests (one per line, as the Collector's file exporter appends them);
- OTLP protobuf files (a serialized ``ExportTraceServiceRequest``);
- gzip-compressed variants of each, detected by their magic bytes, not by their name;
- directories, walked recursively (files with a trace extension only, see
  :data:`TRACE_SUFFIXES`), and ``-`` for standard input.

Bad input never stops the read: a file that is not OTLP, truncated JSON, a bad JSON Lines
line or a span without a trace id becomes a :class:`Problem` naming the file (and the line),
and everything else is still read. A span that cannot be decoded (invalid UTF-8, a lone
surrogate escape, nesting too deep) is reported and skipped, and the file's other spans are
kept; a time that is not a Unix time in nanoseconds is reported and read as missing; an
attribute nested deeper than :data:`MAX_ATTRIBUTE_DEPTH` levels is cut there. A UTF-8
byte-order mark is accepted.

Bounds: what is not a regular file (a FIFO, a device such as a symlink to ``/dev/zero``, a
socket) is reported and never opened for reading, and no input may take more than
``max_file_bytes`` (default :data:`DEFAULT_MAX_FILE_BYTES`), read from disk or once
decompressed: a gzip bomb is stopped at the cap and reported as a bad file.

Speed: JSON is decoded by msgspec straight into typed structs (no intermediate dicts), and a
span's attributes become one plain ``dict`` in a single comprehension. Protobuf is decoded by
the ``opentelemetry-proto`` package, imported only when a protobuf file shows up.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from tripwire.errors import InputError
from tripwire.otel.conventions import SpanView

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_ATTRIBUTE_DEPTH",
    "STDIN",
    "TRACE_SUFFIXES",
    "FileBatch",
    "Problem",
    "expand_paths",
    "read_batches",
    "read_bytes",
    "read_spans",
]

STDIN: Final = "-"
"""The path that means standard input."""

TRACE_SUFFIXES: Final = (".json", ".jsonl", ".ndjson", ".pb", ".protobuf", ".otlp", ".bin")
"""File name endings a directory walk picks up (each also with ``.gz``). Files named
explicitly are read whatever their name."""

DEFAULT_MAX_FILE_BYTES: Final = 1 << 30
"""The most one input may take (1 GiB), on disk and once decompressed; the CLI's
``--max-file-size`` raises it. Reading holds a file in memory, about twice over while decoding."""
MAX_ATTRIBUTE_DEPTH: Final = 32
"""Attribute values nested deeper than this (arrays in arrays…) are cut: no emitter writes them,
and walking them would exhaust the stack."""

_GZIP_MAGIC: Final = b"\x1f\x8b"
_BOM: Final = b"\xef\xbb\xbf"
_MAX_NANOS: Final = 1 << 64
"""OTLP times are fixed64 nanoseconds: anything at or above this is not one."""
_JSONL_SUFFIXES: Final = (".jsonl", ".ndjson")


# -- problems ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """Something in the input that could not be read; the rest of the input still is."""

    source: str
    """The file (``<stdin>`` for standard input)."""
    detail: str
    """What is wrong, in a few words (never span content)."""
    line: int | None = None
    """The 1-based line, for JSON Lines input."""
    skipped: bool = False
    """True for a file a directory walk found that is not OTLP (a note, not an error)."""

    def __str__(self) -> str:
        where = f"{self.source}:{self.line}" if self.line is not None else self.source
        return f"{where}: {self.detail}"

    def to_error(self) -> InputError:
        """The same problem as an :class:`~tripwire.errors.InputError` (to raise it)."""
        return InputError(self.source, self.detail, self.line)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"source": self.source, "line": self.line, "detail": self.detail, "skipped": self.skipped}


@dataclass(slots=True)
class FileBatch:
    """What one input file gave: its spans and its problems."""

    source: str
    """The file, as given or found (``<stdin>`` for standard input)."""
    spans: list[SpanView] = field(default_factory=list)
    """The spans read, in file order."""
    problems: list[Problem] = field(default_factory=list)
    """What could not be read."""
    nbytes: int = 0
    """The file's size on disk (compressed), for progress bars."""


# -- OTLP/JSON structs (the protobuf JSON mapping; camelCase on the wire) --------------------


class _Base(msgspec.Struct, rename="camel", omit_defaults=True):
    pass


class _ArrayValue(_Base):
    values: list[_AnyValue] = []


class _KvList(_Base):
    values: list[_KeyValue] = []


class _AnyValue(_Base):
    string_value: str | None = None
    int_value: int | str | None = None
    double_value: float | str | None = None
    bool_value: bool | None = None
    bytes_value: str | None = None
    array_value: _ArrayValue | None = None
    kvlist_value: _KvList | None = None


class _KeyValue(_Base):
    key: str = ""
    value: _AnyValue | None = None


class _Status(_Base):
    code: int | str | None = None
    message: str | None = None


class _Event(_Base):
    name: str = ""
    attributes: list[_KeyValue] = []


class _Span(_Base):
    trace_id: str = ""
    span_id: str = ""
    parent_span_id: str = ""
    name: str = ""
    start_time_unix_nano: int | str | None = None
    end_time_unix_nano: int | str | None = None
    attributes: list[_KeyValue] = []
    events: list[_Event] = []
    status: _Status | None = None


class _Scope(_Base):
    name: str = ""


class _ScopeSpans(_Base):
    scope: _Scope | None = None
    spans: list[_Span] = []


class _Resource(_Base):
    attributes: list[_KeyValue] = []


class _ResourceSpans(_Base):
    resource: _Resource | None = None
    scope_spans: list[_ScopeSpans] = []
    instrumentation_library_spans: list[_ScopeSpans] = []
    """The pre-1.0 name of ``scopeSpans`` (old Collectors still write it)."""


class _Request(_Base):
    resource_spans: list[_ResourceSpans] | msgspec.UnsetType = msgspec.UNSET


_DECODER: Final = msgspec.json.Decoder(_Request)


class _Cut:
    """Counts attribute values cut at :data:`MAX_ATTRIBUTE_DEPTH` and bad times, per request."""

    __slots__ = ("deep", "times")

    def __init__(self) -> None:
        self.deep = 0
        self.times = 0


def _any(v: _AnyValue | None, cut: _Cut | None = None, depth: int = 0) -> Any:
    """The Python value of an OTLP ``AnyValue`` (str, int, float, bool, bytes, tuple, dict)."""
    if v is None:
        return None
    s = v.string_value
    if s is not None:
        return s
    i = v.int_value
    if i is not None:
        if isinstance(i, str):
            try:
                return int(i)
            except ValueError:  # not an integer, or over Python's 4,300-digit limit
                return i
        return i
    b = v.bool_value
    if b is not None:
        return b
    d = v.double_value
    if d is not None:
        if isinstance(d, str):  # "NaN", "Infinity", "-Infinity" in the protobuf JSON mapping
            try:
                return float(d)
            except ValueError:
                return d
        return d
    if v.array_value is not None or v.kvlist_value is not None:
        if depth >= MAX_ATTRIBUTE_DEPTH:
            if cut is not None:
                cut.deep += 1
            return None
        if v.array_value is not None:
            return tuple(_any(x, cut, depth + 1) for x in v.array_value.values)
        assert v.kvlist_value is not None
        return {kv.key: _any(kv.value, cut, depth + 1) for kv in v.kvlist_value.values}
    if v.bytes_value is not None:
        try:
            return base64.b64decode(v.bytes_value)
        except (binascii.Error, ValueError):
            return v.bytes_value
    return None


def _attrs(kvs: list[_KeyValue], cut: _Cut | None = None) -> dict[str, Any]:
    # The common case (a string value) is inlined: one attribute access and a test.
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        if v is not None and v.string_value is not None:
            out[kv.key] = v.string_value
        else:
            out[kv.key] = _any(v, cut)
    return out


def _id(value: str, nbytes: int) -> str | None:
    """A hex id from hex (OTLP file exporter) or base64 (``MessageToJson``); ``None`` if neither.

    The two forms never collide: 16 bytes are 32 hex characters but 24 base64 characters.
    """
    if not value:
        return None
    if len(value) == 2 * nbytes:
        try:
            bytes.fromhex(value)
        except ValueError:
            pass
        else:
            return value.lower()
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        try:
            raw = base64.urlsafe_b64decode(value)
        except (binascii.Error, ValueError):
            return None
    if len(raw) != nbytes:
        return None
    return raw.hex()


def _seconds(nanos: int | str | None, cut: _Cut) -> float | None:
    """Seconds from OTLP nanoseconds; ``None`` for 0 (unset), and for what is not a time."""
    if nanos is None:
        return None
    if isinstance(nanos, str):
        if len(nanos) > 24:  # 2**64 has 20 digits: a longer string is no time
            cut.times += 1
            return None
        try:
            nanos = int(nanos)
        except ValueError:
            cut.times += 1
            return None
    if nanos == 0:
        return None
    if not 0 < nanos < _MAX_NANOS:
        cut.times += 1
        return None
    return nanos / 1e9


def _is_error(status: _Status | None) -> bool:
    if status is None:
        return False
    code = status.code
    return code == 2 or code == "STATUS_CODE_ERROR"


def _exception_type(events: list[_Event]) -> str | None:
    for event in events:
        if event.name == "exception":
            for kv in event.attributes:
                if kv.key == "exception.type":
                    value = _any(kv.value, None, MAX_ATTRIBUTE_DEPTH)
                    return value if isinstance(value, str) and value else None
            return None
    return None


_Group = tuple["dict[str, Any] | None", "str | None", "list[_Span]"]
"""One scope's spans: (resource attributes, scope name, spans)."""


def _groups(req: _Request, cut: _Cut) -> Iterator[_Group]:
    assert not isinstance(req.resource_spans, msgspec.UnsetType)
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes, cut) if rs.resource is not None else None
        for ss in rs.scope_spans or rs.instrumentation_library_spans:
            scope = ss.scope.name or None if ss.scope is not None else None
            yield resource, scope, ss.spans


def _views_from_request(
    req: _Request, source: str, line: int | None, problems: list[Problem]
) -> list[SpanView]:
    cut = _Cut()
    return _views(_groups(req, cut), source, line, problems, cut)


def _views(
    groups: Iterable[_Group], source: str, line: int | None, problems: list[Problem], cut: _Cut
) -> list[SpanView]:
    out: list[SpanView] = []
    missing = bad_ids = 0
    for resource, scope, spans in groups:
        for sp in spans:
            if not sp.trace_id:
                missing += 1
                continue
            trace_id = _id(sp.trace_id, 16)
            span_id = _id(sp.span_id, 8) if sp.span_id else ""
            if trace_id is None or span_id is None:
                bad_ids += 1
                continue
            error = _is_error(sp.status)
            out.append(
                SpanView(
                    trace_id=trace_id,
                    span_id=span_id,
                    parent_span_id=_id(sp.parent_span_id, 8) if sp.parent_span_id else None,
                    name=sp.name,
                    start_s=_seconds(sp.start_time_unix_nano, cut),
                    end_s=_seconds(sp.end_time_unix_nano, cut),
                    status_error=error,
                    status_message=sp.status.message if sp.status is not None else None,
                    exception_type=_exception_type(sp.events) if error else None,
                    attributes=_attrs(sp.attributes, cut),
                    resource_attributes=resource,
                    scope_name=scope,
                )
            )
    if missing:
        problems.append(
            Problem(source, f"{missing} span(s) without a trace id (skipped)", line)
        )
    if bad_ids:
        problems.append(
            Problem(source, f"{bad_ids} span(s) whose trace or span id is neither hex nor base64 of the right length (skipped)", line)
        )
    if cut.times:
        problems.append(
            Problem(source, f"{cut.times} span time(s) that are not Unix times in nanoseconds (read as missing)", line)
        )
    if cut.deep:
        problems.append(
            Problem(source, f"{cut.deep} attribute value(s) nested deeper than {MAX_ATTRIBUTE_DEPTH} levels (cut there)", line)
        )
    return out


# -- recovery: one bad span must not lose the rest of the file ------------------------------


class _RawScopeSpans(_Base):
    scope: _Scope | None = None
    spans: list[msgspec.Raw] = []


_NO_RAW: Final = msgspec.Raw(b"")


class _RawResourceSpans(_Base):
    resource: msgspec.Raw = _NO_RAW
    scope_spans: list[_RawScopeSpans] = []
    instrumentation_library_spans: list[_RawScopeSpans] = []


class _RawRequest(_Base):
    resource_spans: list[_RawResourceSpans] | msgspec.UnsetType = msgspec.UNSET


_RAW_DECODER: Final = msgspec.json.Decoder(_RawRequest)
_SPAN_DECODER: Final = msgspec.json.Decoder(_Span)
_RESOURCE_DECODER: Final = msgspec.json.Decoder(_Resource)


def _span_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        return f"not an OTLP span: {text}"
    if "UTF-8" in text:
        return "invalid UTF-8"
    if "surrogate" in text:
        return "a lone surrogate escape"
    return text


_LONE_SURROGATE: Final = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
"""A ``\\uD800``-style escape that is not half of a surrogate pair (JSON cannot decode it)."""
_MARK: Final = b"\\udbff\\udfff"
"""What a lone surrogate escape is swapped for to find its span (U+10FFFF, a noncharacter)."""


def _recover(data: bytes, source: str, line: int | None, problems: list[Problem]) -> list[SpanView] | None:
    """Decode span by span after the whole request failed; ``None`` if the envelope is bad too.

    Each span's JSON is kept as raw bytes by the envelope decode, then decoded on its own: a
    span holding an invalid UTF-8 byte, a lone surrogate or nesting too deep is reported and
    skipped, and every other span of the file is kept.
    """
    marked = b"\\u" in data and _LONE_SURROGATE.search(data) is not None
    if marked:
        data = _LONE_SURROGATE.sub(lambda _: _MARK, data)
    try:
        req = _RAW_DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(req.resource_spans, msgspec.UnsetType):
        return None
    bad: list[str] = []
    cut = _Cut()
    groups: list[_Group] = []
    for rs in req.resource_spans:
        resource: dict[str, Any] | None = None
        if len(rs.resource) and bytes(rs.resource) != b"null":
            if marked and _MARK in bytes(rs.resource):
                bad.append("resource: a lone surrogate escape")
            try:
                resource = _attrs(_RESOURCE_DECODER.decode(rs.resource).attributes, cut)
            except (msgspec.DecodeError, RecursionError) as exc:
                bad.append(f"resource: {_span_error(exc)}")
        for ss in rs.scope_spans or rs.instrumentation_library_spans:
            scope = ss.scope.name or None if ss.scope is not None else None
            spans: list[_Span] = []
            for raw in ss.spans:
                if marked and _MARK in bytes(raw):
                    bad.append("a lone surrogate escape")
                    continue
                try:
                    spans.append(_SPAN_DECODER.decode(raw))
                except (msgspec.DecodeError, RecursionError) as exc:
                    bad.append(_span_error(exc))
            groups.append((resource, scope, spans))
    views = _views(groups, source, line, problems, cut)
    if bad:
        reasons = ", ".join(sorted(set(bad))[:3])
        problems.append(
            Problem(source, f"{len(bad)} span(s) could not be decoded ({reasons}); skipped, the rest was read", line)
        )
    return views


def _json_error(exc: msgspec.DecodeError) -> str:
    text = str(exc)
    if text.startswith("Input data was truncated"):
        return "truncated JSON (the file ends in the middle of a value)"
    if isinstance(exc, msgspec.ValidationError):
        return f"not an OTLP ExportTraceServiceRequest: {text}"
    return f"invalid JSON: {text}"


# -- protobuf -----------------------------------------------------------------------------------


def _pb_any(v: Any, depth: int = 0) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value") and depth >= MAX_ATTRIBUTE_DEPTH:
        return None
    if kind == "array_value":
        return tuple(_pb_any(x, depth + 1) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _pb_any(kv.value, depth + 1) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def _pb_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _pb_any(kv.value) for kv in kvs}


def _read_protobuf(data: bytes, source: str, problems: list[Problem]) -> list[SpanView]:
    try:
        from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
    except ImportError:
        problems.append(
            Problem(
                source,
                "looks like OTLP protobuf, which needs opentelemetry-proto: "
                "pip install 'tripwire[otel]'",
            )
        )
        return []
    # A serialized ExportTraceServiceRequest starts with field 1, wire type 2 (0x0a). Protobuf
    # parsing is lenient enough to accept many random byte strings, so check that first.
    if data[:1] != b"\x0a":
        problems.append(Problem(source, "not OTLP: neither JSON nor a protobuf ExportTraceServiceRequest"))
        return []
    try:
        req = ExportTraceServiceRequest.FromString(data)
    except (DecodeError, ValueError, RuntimeError):
        problems.append(Problem(source, "not OTLP: neither JSON nor a valid protobuf ExportTraceServiceRequest (truncated?)"))
        return []
    out: list[SpanView] = []
    missing = 0
    for rs in req.resource_spans:
        resource = _pb_attrs(rs.resource.attributes) if rs.HasField("resource") else None
        for ss in rs.scope_spans:
            scope = ss.scope.name or None
            for sp in ss.spans:
                if len(sp.trace_id) != 16:
                    missing += 1
                    continue
                error = sp.status.code == 2
                exc_type: str | None = None
                if error:
                    for ev in sp.events:
                        if ev.name == "exception":
                            value = _pb_attrs(ev.attributes).get("exception.type")
                            exc_type = value if isinstance(value, str) and value else None
                            break
                out.append(
                    SpanView(
                        trace_id=sp.trace_id.hex(),
                        span_id=sp.span_id.hex(),
                        parent_span_id=sp.parent_span_id.hex() or None,
                        name=sp.name,
                        start_s=sp.start_time_unix_nano / 1e9 if sp.start_time_unix_nano else None,
                        end_s=sp.end_time_unix_nano / 1e9 if sp.end_time_unix_nano else None,
                        status_error=error,
                        status_message=sp.status.message or None,
                        exception_type=exc_type,
                        attributes=_pb_attrs(sp.attributes),
                        resource_attributes=resource,
                        scope_name=scope,
                    )
                )
    if missing:
        problems.append(Problem(source, f"{missing} span(s) without a valid trace id (skipped)"))
    return out


# -- files ----------------------------------------------------------------------------------------


class _OverCap(Exception):
    """Decompressed data would exceed the cap."""


def _gunzip(data: bytes, limit: int) -> bytes:
    """Undo gzip (every member), stopping as soon as the output would exceed ``limit`` bytes.

    Raises:
        _OverCap: the output would exceed ``limit``.
        EOFError, zlib.error: truncated or corrupt data.
    """
    out = bytearray()
    while data:
        d = zlib.decompressobj(wbits=31)
        buf = data
        while True:
            out += d.decompress(buf, limit + 1 - len(out))  # max_length >= 1: never "unbounded"
            if len(out) > limit:
                raise _OverCap()
            buf = d.unconsumed_tail
            if d.eof or not buf:
                break
        if not d.eof:
            raise EOFError("gzip data ends early")
        data = d.unused_data.lstrip(b"\x00")  # members may be padded with zeros
        if data and data[:2] != _GZIP_MAGIC:
            raise zlib.error("trailing garbage after the gzip data")
    return bytes(out)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def read_bytes(
    data: bytes,
    source: str,
    *,
    found_in_walk: bool = False,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> FileBatch:
    """Decode one input (already read into memory) whatever its format.

    Args:
        data: the file's bytes (gzip is detected and undone here).
        source: the name to put in problems.
        found_in_walk: True when a directory walk found the file: a JSON file that is not OTLP
            (a labels file, a config) is then skipped with a note instead of an error.
        max_file_bytes: the most the data may decompress to; past it the file is a problem.

    Returns:
        The spans and the problems; never raises for any content.
    """
    batch = FileBatch(source, nbytes=len(data))
    try:
        _decode_into(batch, data, source, found_in_walk, max_file_bytes)
    except (RecursionError, OverflowError) as exc:
        # A safety net for hostile input the checks above did not foresee: the file is
        # reported like any other bad file, and the other files are still read.
        batch.spans = []
        batch.problems.append(Problem(source, f"cannot be decoded ({type(exc).__name__})"))
    return batch


def _decode_into(
    batch: FileBatch, data: bytes, source: str, found_in_walk: bool, max_file_bytes: int
) -> None:
    name = source.lower()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = _gunzip(data, max_file_bytes)
        except _OverCap:
            batch.problems.append(Problem(
                source,
                f"decompresses to more than {_size(max_file_bytes)}, the cap per file; skipped "
                "(raise it with --max-file-size if the file is genuine)",
            ))
            return
        except (OSError, EOFError, zlib.error):
            batch.problems.append(Problem(source, "gzip data is truncated or corrupt"))
            return
        name = name.removesuffix(".gz")
    if data[:3] == _BOM:
        data = data[3:]
    head = data.lstrip()[:1]
    if not head:
        batch.problems.append(Problem(source, "empty input (no OTLP data)"))
        return
    if head not in (b"{", b"["):
        batch.spans = _read_protobuf(data, source, batch.problems)
        return

    if name.endswith(_JSONL_SUFFIXES):
        _read_jsonl(data, source, batch, found_in_walk)
        return
    try:
        req = _DECODER.decode(data)
    except (msgspec.DecodeError, RecursionError) as exc:
        # JSON Lines under another name: the first line is a complete JSON document by itself
        # (a pretty-printed file's first line is just "{").
        first, _, rest = data.partition(b"\n")
        if rest.strip() and _is_json(first):
            _read_jsonl(data, source, batch, found_in_walk)
            return
        recovered = _recover(data, source, None, batch.problems)
        if recovered is not None:
            batch.spans = recovered
            return
        if isinstance(exc, RecursionError):
            batch.problems.append(Problem(source, "invalid JSON: nested too deeply"))
        else:
            batch.problems.append(Problem(source, _json_error(exc)))
        return
    if isinstance(req.resource_spans, msgspec.UnsetType):
        batch.problems.append(_not_otlp(source, None, found_in_walk))
        return
    batch.spans = _views_from_request(req, source, None, batch.problems)


def _is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _not_otlp(source: str, line: int | None, found_in_walk: bool) -> Problem:
    if found_in_walk:
        return Problem(source, "not OTLP (JSON without resourceSpans); skipped", line, skipped=True)
    return Problem(source, "not an OTLP ExportTraceServiceRequest (no resourceSpans)", line)


def _read_jsonl(data: bytes, source: str, batch: FileBatch, found_in_walk: bool) -> None:
    decode = _DECODER.decode
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            req = decode(raw)
        except (msgspec.DecodeError, RecursionError) as exc:
            recovered = _recover(raw, source, number, batch.problems)
            if recovered is not None:
                batch.spans.extend(recovered)
            elif isinstance(exc, RecursionError):
                batch.problems.append(Problem(source, "invalid JSON: nested too deeply", number))
            else:
                batch.problems.append(Problem(source, _json_error(exc), number))
            continue
        if isinstance(req.resource_spans, msgspec.UnsetType):
            if found_in_walk and not batch.spans and number == 1:
                batch.problems.append(_not_otlp(source, None, True))
                return
            batch.problems.append(_not_otlp(source, number, False))
            continue
        batch.spans.extend(_views_from_request(req, source, number, batch.problems))


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> Iterator[tuple[str, bool]]:
    """``(path, found_in_walk)`` for every input file: directories are walked recursively.

    Files inside directories are taken in sorted order (deterministic replay), hidden files
    and folders are skipped, and only names ending in :data:`TRACE_SUFFIXES` (or those
    plus ``.gz``) are kept. ``-`` is passed through for standard input. A path that does not
    exist is passed through too: reading it reports the problem.
    """
    for p in paths:
        text = os.fspath(p)
        if text == STDIN or not os.path.isdir(text):
            yield text, False
            continue
        for root, dirs, files in os.walk(text):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if name.startswith("."):
                    continue
                lower = name.lower().removesuffix(".gz")
                if lower.endswith(TRACE_SUFFIXES):
                    yield os.path.join(root, name), True


def _read_file(path: str, limit: int) -> bytes | Problem:
    """The file's bytes, or the problem: never opens a FIFO or a device for a blocking read."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return Problem(path, "no such file or directory")
    except OSError as exc:
        return Problem(path, f"cannot be read ({exc.strerror or exc})")
    with os.fdopen(fd, "rb", buffering=0) as fh:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                kind = (
                    "a FIFO" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
                    else "a socket" if stat.S_ISSOCK(info.st_mode)
                    else "not a file"
                )
                return Problem(path, f"not a regular file ({kind}); skipped")
            if info.st_size > limit:
                return Problem(path, f"{_size(info.st_size)}, over the cap of {_size(limit)} per "
                               "file; skipped (raise it with --max-file-size)")
            data = fh.read(limit + 1)
        except OSError as exc:
            return Problem(path, f"cannot be read ({exc.strerror or exc})")
    if len(data) > limit:
        return Problem(path, f"over the cap of {_size(limit)} per file; skipped (raise it with --max-file-size)")
    return data


def read_batches(
    paths: Iterable[str | os.PathLike[str]],
    *,
    on_file: Callable[[str, int], None] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Iterator[FileBatch]:
    """Read every input, one :class:`FileBatch` per file, in order.

    Args:
        paths: files, directories (walked recursively), or ``-`` for standard input.
        on_file: called with ``(path, size in bytes)`` before each file is read (progress).
        max_file_bytes: the most one input may take, on disk and once decompressed; a larger
            one is a problem, and nothing past the cap is read.
    """
    for path, walked in expand_paths(paths):
        if path == STDIN:
            data = sys.stdin.buffer.read(max_file_bytes + 1)
            if on_file is not None:
                on_file(path, len(data))
            if len(data) > max_file_bytes:
                yield FileBatch("<stdin>", problems=[Problem(
                    "<stdin>", f"over the cap of {_size(max_file_bytes)}; skipped (raise it with --max-file-size)")])
                continue
            yield read_bytes(data, "<stdin>", max_file_bytes=max_file_bytes)
            continue
        read = _read_file(path, max_file_bytes)
        if isinstance(read, Problem):
            yield FileBatch(path, problems=[read])
            continue
        if on_file is not None:
            on_file(path, len(read))
        yield read_bytes(read, path, found_in_walk=walked, max_file_bytes=max_file_bytes)


def read_spans(
    paths: Iterable[str | os.PathLike[str]],
    problems: list[Problem] | None = None,
) -> Iterator[SpanView]:
    """Every span of every input, in file order; problems are appended to ``problems``.

    Args:
        paths: files, directories (walked recursively), or ``-`` for standard input.
        problems: a list to collect problems in (``None``: they are dropped).
    """
    for batch in read_batches(paths):
        if problems is not None:
            problems.extend(batch.problems)
        yield from batch.spans

