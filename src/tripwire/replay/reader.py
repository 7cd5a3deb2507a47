"""OTLP trace files → :class:`~tripwire.spans.SpanView` objects.

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
and everything else is still read.

Speed: JSON is decoded by msgspec straight into typed structs (no intermediate dicts), and a
span's attributes become one plain ``dict`` in a single comprehension. Protobuf is decoded by
the ``opentelemetry-proto`` package, imported only when a protobuf file shows up.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import os
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec

from tripwire.errors import InputError
from tripwire.spans import SpanView

__all__ = [
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

_GZIP_MAGIC: Final = b"\x1f\x8b"
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


def _any(v: _AnyValue | None) -> Any:
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
            except ValueError:
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
    if v.array_value is not None:
        return tuple(_any(x) for x in v.array_value.values)
    if v.kvlist_value is not None:
        return {kv.key: _any(kv.value) for kv in v.kvlist_value.values}
    if v.bytes_value is not None:
        try:
            return base64.b64decode(v.bytes_value)
        except (binascii.Error, ValueError):
            return v.bytes_value
    return None


def _attrs(kvs: list[_KeyValue]) -> dict[str, Any]:
    # The common case (a string value) is inlined: one attribute access and a test.
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        if v is not None and v.string_value is not None:
            out[kv.key] = v.string_value
        else:
            out[kv.key] = _any(v)
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


def _seconds(nanos: int | str | None) -> float | None:
    if nanos is None:
        return None
    if isinstance(nanos, str):
        try:
            nanos = int(nanos)
        except ValueError:
            return None
    return nanos / 1e9 if nanos > 0 else None


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
                    value = _any(kv.value)
                    return value if isinstance(value, str) and value else None
            return None
    return None


def _views_from_request(
    req: _Request, source: str, line: int | None, problems: list[Problem]
) -> list[SpanView]:
    out: list[SpanView] = []
    assert not isinstance(req.resource_spans, msgspec.UnsetType)
    missing = bad_ids = 0
    for rs in req.resource_spans:
        resource = _attrs(rs.resource.attributes) if rs.resource is not None else None
        groups = rs.scope_spans or rs.instrumentation_library_spans
        for ss in groups:
            scope = ss.scope.name or None if ss.scope is not None else None
            for sp in ss.spans:
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
                        start_s=_seconds(sp.start_time_unix_nano),
                        end_s=_seconds(sp.end_time_unix_nano),
                        status_error=error,
                        status_message=sp.status.message if sp.status is not None else None,
                        exception_type=_exception_type(sp.events) if error else None,
                        attributes=_attrs(sp.attributes),
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
    return out


def _json_error(exc: msgspec.DecodeError) -> str:
    text = str(exc)
    if text.startswith("Input data was truncated"):
        return "truncated JSON (the file ends in the middle of a value)"
    if isinstance(exc, msgspec.ValidationError):
        return f"not an OTLP ExportTraceServiceRequest: {text}"
    return f"invalid JSON: {text}"


# -- protobuf -----------------------------------------------------------------------------------


def _pb_any(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(_pb_any(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _pb_any(kv.value) for kv in v.kvlist_value.values}
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


def read_bytes(data: bytes, source: str, *, found_in_walk: bool = False) -> FileBatch:
    """Decode one input (already read into memory) whatever its format.

    Args:
        data: the file's bytes (gzip is detected and undone here).
        source: the name to put in problems.
        found_in_walk: True when a directory walk found the file: a JSON file that is not OTLP
            (a labels file, a config) is then skipped with a note instead of an error.

    Returns:
        The spans and the problems; never raises for any content.
    """
    batch = FileBatch(source, nbytes=len(data))
    name = source.lower()
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            batch.problems.append(Problem(source, "gzip data is truncated or corrupt"))
            return batch
        name = name.removesuffix(".gz")
    head = data.lstrip()[:1]
    if not head:
        batch.problems.append(Problem(source, "empty input (no OTLP data)"))
        return batch
    if head not in (b"{", b"["):
        batch.spans = _read_protobuf(data, source, batch.problems)
        return batch

    if name.endswith(_JSONL_SUFFIXES):
        _read_jsonl(data, source, batch, found_in_walk)
        return batch
    try:
        req = _DECODER.decode(data)
    except msgspec.DecodeError as exc:
        # JSON Lines under another name: the first line is a complete JSON document by itself
        # (a pretty-printed file's first line is just "{").
        first, _, rest = data.partition(b"\n")
        if rest.strip() and _is_json(first):
            _read_jsonl(data, source, batch, found_in_walk)
            return batch
        batch.problems.append(Problem(source, _json_error(exc)))
        return batch
    if isinstance(req.resource_spans, msgspec.UnsetType):
        batch.problems.append(_not_otlp(source, None, found_in_walk))
        return batch
    batch.spans = _views_from_request(req, source, None, batch.problems)
    return batch


def _is_json(line: bytes) -> bool:
    try:
        msgspec.json.decode(line)
    except msgspec.DecodeError:
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
        except msgspec.DecodeError as exc:
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


def read_batches(
    paths: Iterable[str | os.PathLike[str]],
    *,
    on_file: Callable[[str, int], None] | None = None,
) -> Iterator[FileBatch]:
    """Read every input, one :class:`FileBatch` per file, in order.

    Args:
        paths: files, directories (walked recursively), or ``-`` for standard input.
        on_file: called with ``(path, size in bytes)`` before each file is read (progress).
    """
    for path, walked in expand_paths(paths):
        if path == STDIN:
            data = sys.stdin.buffer.read()
            if on_file is not None:
                on_file(path, len(data))
            yield read_bytes(data, "<stdin>")
            continue
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            yield FileBatch(path, problems=[Problem(path, "no such file or directory")])
            continue
        except OSError as exc:
            yield FileBatch(path, problems=[Problem(path, f"cannot be read ({exc.strerror or exc})")])
            continue
        if on_file is not None:
            on_file(path, len(data))
        yield read_bytes(data, path, found_in_walk=walked)


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

