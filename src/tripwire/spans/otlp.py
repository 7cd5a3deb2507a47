"""The one OTLP trace decoder: protobuf or JSON ``ExportTraceServiceRequest`` bytes → span views.

``tripwire serve`` (each export request) and ``tripwire replay`` (each file) both decode with
:func:`decode_protobuf` and :func:`decode_json`, so a span means the same to both. Only what the
span mapping reads is kept: span names, ids, times, status, the first exception event's type,
and the attributes whose key starts with one of :data:`WANTED_PREFIXES` or is one of
:data:`WANTED_KEYS`; every other attribute is skipped without being converted.

Protobuf is read by a wire scanner, not decoded into messages: the compiled
``tripwire.spans._otlpscan`` when it was built (a stateless leaf, like the signature's
accelerator), else its Python twin :mod:`tripwire.spans._wire` (``TRIPWIRE_NO_EXTENSIONS=1``
selects the twin). Both follow the same rules, listed in :mod:`tripwire.spans._wire`. JSON is
decoded by msgspec into structs of the protobuf JSON mapping; when it was built, the compiled
``tripwire.spans._otlpjson`` reads first the requests it can read exactly as msgspec does (hex
ids, times as plain nanoseconds, every field once and of its type: what exporters send) in one
pass, converting only the wanted attributes, and hands every other request to msgspec.

Values: strings, ints (OTLP/JSON's quoted ints too), floats, bools, ``bytes``, arrays as
``tuple`` (as the SDK holds them) and kvlists as ``dict``; arrays and kvlists nested deeper than
:data:`MAX_DEPTH` are cut (``None``, counted in :attr:`Decoded.deep`).

Bad input: an envelope that is not OTLP raises :class:`~tripwire.errors.InputError` naming what
is wrong (the receiver answers 400, replay reports the file); a span that cannot be read (a bad
trace id, invalid UTF-8 in it, a truncated field inside it) is rejected alone and counted, and
the rest of the request is kept (OTLP's partial success).
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from tripwire.core._compiled import compiled
from tripwire.errors import InputError
from tripwire.spans import _wire
from tripwire.spans.mapping import SpanView

__all__ = [
    "MAX_DEPTH",
    "WANTED_KEYS",
    "WANTED_PREFIXES",
    "BodyTooLarge",
    "Decoded",
    "DecodedSpan",
    "decode_json",
    "decode_protobuf",
    "decode_request",
    "decompress",
    "scanner",
]

WANTED_PREFIXES: Final = (
    "gen_ai.",
    "openinference.",
    "traceloop.",
    "llm.",
    "input.",
    "output.",
    "tool.",
    "tool_call.",
    "error.",
    "exception.",
    "agent.",
    "pydantic_ai.",
    "gcp.vertex.",
    "operation.",
    "session.",
    "tripwire.",
    "service.",
)
"""Attribute key prefixes the decoder keeps (with :data:`WANTED_KEYS`: all the mapping reads,
and ``service.name``)."""

WANTED_KEYS: Final = frozenset(
    {
        "metadata",
        "tool_arguments",
        "tool_response",
        "ai.operationId",
        "ai.telemetry.functionId",
        "ai.toolCall.name",
        "ai.toolCall.id",
        "ai.toolCall.args",
        "ai.toolCall.result",
    }
)
"""Attribute keys without one of the prefixes that the mapping reads (OpenInference's
``metadata``, pydantic-ai's ``tool_arguments``, ``tool_response``, the Vercel AI SDK's
``ai.*`` keys: not the prefix ``ai.``, which also holds every prompt and answer)."""

MAX_DEPTH: Final = 32
"""``arrayValue``/``kvlistValue`` nested deeper than this are cut (kept as ``None``)."""

_PREFIX_BYTES: Final = tuple(p.encode() for p in WANTED_PREFIXES)
_KEY_BYTES: Final = frozenset(k.encode() for k in WANTED_KEYS)


class DecodedSpan(msgspec.Struct, frozen=True, gc=False):
    """A decoded span: the fields of :class:`~tripwire.spans.SpanView`, built ten times faster.

    (A frozen dataclass of 12 fields costs ~5 µs to build, more than decoding the span.) The
    mapping reads it as the ``SpanView`` it mimics; :meth:`view` gives a real one.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_s: float | None
    end_s: float | None
    status_error: bool
    status_message: str | None
    exception_type: str | None
    attributes: dict[str, Any]
    resource_attributes: dict[str, Any] | None
    scope_name: str | None

    def view(self) -> SpanView:
        """The same span as a :class:`~tripwire.spans.SpanView`."""
        return SpanView(**{f: getattr(self, f) for f in self.__struct_fields__})


class BodyTooLarge(InputError):
    """The request body is over the receiver's size limit (answered with 413)."""


@dataclass(slots=True)
class Decoded:
    """One decoded request: its spans, and what could not be read."""

    views: list[SpanView] = field(default_factory=list)
    """The spans (:class:`DecodedSpan` objects, read as ``SpanView``), in request order."""
    rejected: int = 0
    """Spans that could not be read (kept out, counted in the partial-success answer)."""
    message: str = ""
    """Why spans were rejected (the first reason), empty when none were."""
    missing_ids: int = 0
    """Of the rejected: spans without a trace id."""
    bad_ids: int = 0
    """Of the rejected: spans whose trace or span id is not an id."""
    undecodable: list[str] = field(default_factory=list)
    """Of the rejected: why each span that could not be decoded at all was not."""
    bad_times: int = 0
    """Span times that are not Unix times in nanoseconds (read as missing; JSON only)."""
    deep: int = 0
    """Attribute values cut at :data:`MAX_DEPTH`."""
    envelope: bool = True
    """False for JSON without ``resourceSpans`` (not OTLP, or an empty request)."""

    def reject(self, why: str) -> None:
        self.rejected += 1
        if not self.message:
            self.message = why


# -- protobuf -------------------------------------------------------------------------------


def scanner() -> Any:
    """The protobuf scanner in use: ``_otlpscan.scan`` (compiled) or ``_wire.scan`` (Python)."""
    module = compiled("spans._otlpscan")
    return _wire.scan if module is None else module.scan


_SCAN: Final = scanner()
_BAD_SPAN_ID_MESSAGE: Final = "a span has an invalid trace_id or span_id"


def decode_protobuf(body: bytes) -> Decoded:
    """Decode one serialized ``ExportTraceServiceRequest``.

    Raises:
        InputError: the request's envelope is broken (field ``body``).
    """
    try:
        entries, deep = _SCAN(body, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
    except ValueError as exc:
        raise InputError("body", f"not an OTLP ExportTraceServiceRequest in protobuf ({exc})") from None
    out = Decoded(deep=deep)
    make = DecodedSpan
    views: list[Any] = out.views
    for entry in entries:
        if type(entry) is tuple:
            views.append(make(*entry))
        elif entry == _wire.BAD_IDS:
            out.bad_ids += 1
            out.reject(_BAD_SPAN_ID_MESSAGE)
        else:
            out.undecodable.append(entry)
            out.reject(f"a span could not be decoded ({entry})")
    return out


# -- JSON (the protobuf JSON mapping; camelCase on the wire) --------------------------------


class _Base(msgspec.Struct, rename="camel", omit_defaults=True, gc=False):
    """The decoded JSON is a tree (no cycles): the garbage collector need not track it.

    Every field also takes ``null``, which the protobuf JSON mapping reads as the field's
    default (some encoders write unset fields so): the readers below take ``None`` for it.
    """


class _ArrayValue(_Base):
    values: list[_AnyValue | None] | None = []


class _KvList(_Base):
    values: list[_KeyValue] | None = []


class _AnyValue(_Base):
    string_value: str | None = None
    int_value: int | str | None = None
    double_value: float | str | None = None
    bool_value: bool | None = None
    bytes_value: str | None = None
    array_value: _ArrayValue | None = None
    kvlist_value: _KvList | None = None


class _KeyValue(_Base):
    key: str | None = ""
    value: _AnyValue | None = None


class _Status(_Base):
    code: int | str | None = None
    message: str | None = None


class _Event(_Base):
    name: str | None = ""
    attributes: list[_KeyValue] | None = []


class _Span(_Base):
    trace_id: str | None = ""
    span_id: str | None = ""
    parent_span_id: str | None = ""
    name: str | None = ""
    start_time_unix_nano: int | float | str | None = None
    end_time_unix_nano: int | float | str | None = None
    """Nanoseconds: an int, or its decimal string; a float (``1.7e18``, as some encoders of
    numbers write it) is read as the nearest nanosecond."""
    attributes: list[_KeyValue] | None = []
    events: list[_Event] | None = []
    status: _Status | None = None


class _Scope(_Base):
    name: str | None = ""


class _ScopeSpans(_Base):
    scope: _Scope | None = None
    spans: list[_Span] | None = []


class _Resource(_Base):
    attributes: list[_KeyValue] | None = []


class _ResourceSpans(_Base):
    resource: _Resource | None = None
    scope_spans: list[_ScopeSpans] | None = []
    instrumentation_library_spans: list[_ScopeSpans] | None = []
    """The pre-1.0 name of ``scopeSpans`` (old Collectors still write it)."""


class _Request(_Base):
    resource_spans: list[_ResourceSpans] | msgspec.UnsetType | None = msgspec.UNSET
    """``null`` is an envelope with no spans; absent, the body is no OTLP request."""


def _json_scanner() -> Any:
    """The compiled OTLP/JSON fast path (``_otlpjson.scan``), or ``None`` (not built, or
    ``TRIPWIRE_NO_EXTENSIONS=1``): then every request takes the msgspec decoder below."""
    module = compiled("spans._otlpjson")
    return None if module is None else module.scan


_JSON_SCAN: Final = _json_scanner()
_DECODER: Final = msgspec.json.Decoder(_Request)
_MAX_NANOS: Final = 1 << 64
_BOM: Final = b"\xef\xbb\xbf"


def _any(v: _AnyValue | None, out: Decoded, depth: int = 0) -> Any:
    """The Python value of an OTLP/JSON ``AnyValue``."""
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
        if depth >= MAX_DEPTH:
            out.deep += 1
            return None
        if v.array_value is not None:
            return tuple(_any(x, out, depth + 1) for x in v.array_value.values or ())
        assert v.kvlist_value is not None
        return {kv.key or "": _any(kv.value, out, depth + 1) for kv in v.kvlist_value.values or ()}
    if v.bytes_value is not None:
        try:
            return base64.b64decode(v.bytes_value)
        except (binascii.Error, ValueError):
            return v.bytes_value
    return None


_WANTED: Final[dict[str, bool]] = {}
"""Whether the decoder keeps an attribute key (a pure cache: keys repeat on every span)."""
_WANTED_MAX: Final = 4096
_WANTED_KEY_MAX: Final = 256


def _wanted(key: str) -> bool:
    keep = key.startswith(WANTED_PREFIXES) or key in WANTED_KEYS
    if len(key) <= _WANTED_KEY_MAX:  # bounded in count and bytes whatever the input
        if len(_WANTED) >= _WANTED_MAX:
            _WANTED.clear()
        _WANTED[key] = keep
    return keep


def _attrs(kvs: list[_KeyValue] | None, out: Decoded) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if not kvs:
        return attrs
    wanted = _WANTED.get
    for kv in kvs:
        key = kv.key or ""
        keep = wanted(key)
        if keep or (keep is None and _wanted(key)):
            v = kv.value
            attrs[key] = v.string_value if v is not None and v.string_value is not None else _any(v, out)
    return attrs


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


def _seconds(nanos: int | float | str | None, out: Decoded) -> float | None:
    """Seconds from OTLP nanoseconds; ``None`` for 0 (unset), and for what is not a time."""
    if nanos is None:
        return None
    if isinstance(nanos, float):
        if not 0.0 <= nanos < _MAX_NANOS:  # NaN fails both
            out.bad_times += 1
            return None
        nanos = round(nanos)
    elif isinstance(nanos, str):
        if len(nanos) > 24:  # 2**64 has 20 digits: a longer string is no time
            out.bad_times += 1
            return None
        try:
            nanos = int(nanos)
        except ValueError:
            out.bad_times += 1
            return None
    if nanos == 0:
        return None
    if not 0 < nanos < _MAX_NANOS:
        out.bad_times += 1
        return None
    return nanos / 1e9


def _exception_type(events: list[_Event] | None) -> str | None:
    for event in events or ():
        if event.name == "exception":
            for kv in event.attributes or ():
                if kv.key == "exception.type":
                    v = kv.value
                    s = v.string_value if v is not None else None
                    return s or None
            return None
    return None


_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
_NO_ID: Final[Any] = object()
_BAD_JSON_ID_MESSAGE: Final = "a span has an invalid traceId or spanId"
_MISSING_ID_MESSAGE: Final = "a span has no traceId"

_Group = tuple["dict[str, Any] | None", "str | None", "list[_Span]"]
"""One scope's spans: (resource attributes, scope name, spans)."""


def _groups(req: _Request, out: Decoded) -> Iterator[_Group]:
    assert not isinstance(req.resource_spans, msgspec.UnsetType)
    for rs in req.resource_spans or ():
        resource = _attrs(rs.resource.attributes, out) if rs.resource is not None else None
        for ss in rs.scope_spans or rs.instrumentation_library_spans or ():
            scope = ss.scope.name or None if ss.scope is not None else None
            yield resource, scope, ss.spans or []


def _json_views(groups: Iterable[_Group], out: Decoded) -> None:
    views: list[Any] = out.views
    make = DecodedSpan
    # The spans of a request share a few traces and parents: each id text is read once.
    trace_ids: dict[str, str | None] = {}
    parent_ids: dict[str, str | None] = {}
    for resource, scope, spans in groups:
        for sp in spans:
            text = sp.trace_id
            if not text:
                out.missing_ids += 1
                out.reject(_MISSING_ID_MESSAGE)
                continue
            trace_id = trace_ids.get(text, _NO_ID)
            if trace_id is _NO_ID:
                trace_id = trace_ids[text] = _id(text, 16)
            span_id = _id(sp.span_id, 8) if sp.span_id else ""
            if trace_id is None or span_id is None or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
                out.bad_ids += 1
                out.reject(_BAD_JSON_ID_MESSAGE)
                continue
            text = sp.parent_span_id
            if text:
                parent = parent_ids.get(text, _NO_ID)
                if parent is _NO_ID:
                    parent = _id(text, 8)
                    if parent == _ZERO_SPAN:  # all zeros: no parent (a root), as in protobuf
                        parent = None
                    parent_ids[text] = parent
            else:
                parent = None
            start = sp.start_time_unix_nano
            end = sp.end_time_unix_nano
            status = sp.status
            error = status is not None and status.code in (2, "2", "STATUS_CODE_ERROR")
            views.append(
                make(
                    trace_id,
                    span_id,
                    parent,
                    sp.name or "",
                    start / 1e9 if type(start) is int and 0 < start < _MAX_NANOS else _seconds(start, out),
                    end / 1e9 if type(end) is int and 0 < end < _MAX_NANOS else _seconds(end, out),
                    error,
                    (status.message or None) if status is not None else None,
                    _exception_type(sp.events) if error else None,
                    _attrs(sp.attributes, out),
                    resource,
                    scope,
                )
            )


# -- recovery: one bad span must not lose the rest of the request ---------------------------


class _RawScopeSpans(_Base):
    scope: _Scope | None = None
    spans: list[msgspec.Raw] | None = []


_NO_RAW: Final = msgspec.Raw(b"")


class _RawResourceSpans(_Base):
    resource: msgspec.Raw = _NO_RAW
    scope_spans: list[_RawScopeSpans] | None = []
    instrumentation_library_spans: list[_RawScopeSpans] | None = []


class _RawRequest(_Base):
    resource_spans: list[_RawResourceSpans] | msgspec.UnsetType | None = msgspec.UNSET


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


def _recover(data: bytes) -> Decoded | None:
    """Decode span by span after the whole request failed; ``None`` if the envelope is bad too.

    Each span's JSON is kept as raw bytes by the envelope decode, then decoded on its own: a
    span holding an invalid UTF-8 byte, a lone surrogate or nesting too deep is rejected, and
    every other span is kept.
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
    out = Decoded()
    bad = out.undecodable
    groups: list[_Group] = []
    for rs in req.resource_spans or ():
        resource: dict[str, Any] | None = None
        raw_resource = bytes(rs.resource)
        if raw_resource and raw_resource != b"null":
            if marked and _MARK in raw_resource:
                bad.append("resource: a lone surrogate escape")
            try:
                resource = _attrs(_RESOURCE_DECODER.decode(raw_resource).attributes, out)
            except (msgspec.DecodeError, RecursionError) as exc:
                bad.append(f"resource: {_span_error(exc)}")
        for ss in rs.scope_spans or rs.instrumentation_library_spans or ():
            scope = ss.scope.name or None if ss.scope is not None else None
            spans: list[_Span] = []
            for raw in ss.spans or ():
                if marked and _MARK in bytes(raw):
                    bad.append("a lone surrogate escape")
                    continue
                try:
                    spans.append(_SPAN_DECODER.decode(raw))
                except (msgspec.DecodeError, RecursionError) as exc:
                    bad.append(_span_error(exc))
            groups.append((resource, scope, spans))
    _json_views(groups, out)
    for why in bad:
        out.reject(f"a span could not be decoded ({why})")
    return out


def _json_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply"
    text = str(exc)
    if text.startswith("Input data was truncated"):
        return "truncated JSON (the file ends in the middle of a value)"
    if isinstance(exc, msgspec.ValidationError):
        return f"not an OTLP ExportTraceServiceRequest: {text}"
    return f"invalid JSON: {text}"


def decode_json(body: bytes) -> Decoded:
    """Decode one OTLP/JSON ``ExportTraceServiceRequest`` (a UTF-8 byte-order mark is accepted).

    A request without ``resourceSpans`` decodes to no spans with ``envelope`` False.

    Raises:
        InputError: the body is not JSON, or not an OTLP request (field ``body``).
    """
    if body[:3] == _BOM:
        body = body[3:]
    if _JSON_SCAN is not None:
        # One compiled pass for a request it can read exactly as below (hex ids, plain times,
        # no field twice...); None hands anything else, errors included, to the decoder.
        entries = _JSON_SCAN(body, _PREFIX_BYTES, _KEY_BYTES, MAX_DEPTH)
        if entries is not None:
            fast = Decoded()
            make = DecodedSpan
            views: list[Any] = fast.views  # read as SpanView (see DecodedSpan)
            views += [make(*entry) for entry in entries]
            return fast
    try:
        req = _DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        recovered = _recover(body)
        if recovered is not None:
            return recovered
        raise InputError("body", _json_error(exc)) from None
    out = Decoded()
    if isinstance(req.resource_spans, msgspec.UnsetType):
        out.envelope = False
        return out
    _json_views(_groups(req, out), out)
    return out


def decode_request(body: bytes, content_type: str | None) -> Decoded:
    """Decode one ``ExportTraceServiceRequest`` as OTLP/HTTP sends it.

    Args:
        body: the (decompressed) body.
        content_type: ``application/x-protobuf`` or ``application/json``.

    Raises:
        InputError: an unsupported content type, or a body that is not an OTLP request.
    """
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in ("application/x-protobuf", "application/protobuf"):
        return decode_protobuf(body)
    if kind == "application/json":
        return decode_json(body)
    raise InputError(
        "Content-Type", f"{kind or '(none)'} is not supported: send application/x-protobuf or application/json"
    )


MAX_GZIP_MEMBERS: Final = 4096
"""Gzip members one body may hold at most (exporters send one; ``cat a.gz b.gz`` a few)."""

_FIRST_WINDOW: Final = 256
_MAX_WINDOW: Final = 1 << 20


def decompress(
    body: bytes, encoding: str | None, *, max_bytes: int, max_members: int = MAX_GZIP_MEMBERS
) -> bytes:
    """The request body without its ``Content-Encoding`` (``gzip``, ``deflate`` or none).

    A gzip body may hold several members one after the other (RFC 1952; what concatenated
    gzip files are): they are read in turn, as ``gunzip`` reads them, at most ``max_members``
    of them. The work is linear in the body's size however many members it holds: each member
    is fed to zlib through a window that starts small and doubles, so what zlib hands back
    past a member's end (and copies) is never more than twice the member itself. (Feeding each
    member the whole rest of the body, as this once did, made a 4 MB body of empty members
    take 13 s.)

    Raises:
        InputError: an unknown encoding, a corrupt or truncated stream, data after a deflate
            stream, more than ``max_members`` gzip members, or more than ``max_bytes``
            decompressed (field ``body``; :class:`BodyTooLarge` for the size).
    """
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(body) > max_bytes:
            raise BodyTooLarge("body", f"{len(body)} bytes, over the limit of {max_bytes}")
        return body
    if enc not in ("gzip", "deflate", "x-gzip"):
        raise InputError("Content-Encoding", f"{enc!r} is not supported: send gzip, deflate or identity")
    gzipped = enc != "deflate"
    wbits = 16 + zlib.MAX_WBITS if gzipped else zlib.MAX_WBITS
    view = memoryview(body)
    end = len(body)
    parts: list[bytes] = []
    size = 0
    pos = 0
    members = 0
    while True:
        members += 1
        if members > max_members:
            raise InputError("body", f"more than {max_members} {enc} members in one body")
        inflater = zlib.decompressobj(wbits)
        window = _FIRST_WINDOW
        while not inflater.eof:
            if pos >= end:
                raise InputError("body", f"truncated {enc} data (the body ends inside the compressed stream)")
            chunk = view[pos : pos + window]
            try:
                part = inflater.decompress(chunk, max_bytes + 1 - size)  # at least 1: 0 is no limit
            except zlib.error as exc:
                raise InputError("body", f"corrupt {enc} data ({exc})") from None
            size += len(part)
            if size > max_bytes or inflater.unconsumed_tail:
                raise BodyTooLarge("body", f"over {max_bytes} bytes once decompressed")
            parts.append(part)
            pos += len(chunk) - len(inflater.unused_data)
            window = min(window * 2, _MAX_WINDOW)
        if not gzipped:
            if pos < end:
                raise InputError("body", f"{end - pos} bytes after the end of the deflate stream")
            break
        window = _FIRST_WINDOW
        while pos < end:  # members may be padded with zeros (the same doubling window)
            block = body[pos : pos + window]
            rest = block.lstrip(b"\0")
            pos += len(block) - len(rest)
            if rest:
                break
            window = min(window * 2, _MAX_WINDOW)
        if pos >= end:
            break
    parts = [p for p in parts if p]
    if len(parts) == 1:
        return parts[0]
    return b"".join(parts)

