"""Decode OTLP/HTTP trace requests (protobuf or JSON, gzip or not) into span views.

Only what the span mapping reads is kept: span names, ids, times, status, the first
exception's type, and the attributes whose key starts with one of :data:`WANTED_PREFIXES`
(every key the mapping looks at: GenAI, OpenInference, OpenLLMetry, pydantic-ai, Google ADK…);
everything else is skipped without being converted. Protobuf is decoded with the ``protobuf``
package's upb backend (see :func:`protobuf_backend`: the pure-Python backend is many times
slower, and the service warns at start-up when it runs).

Bad input is an :class:`~tripwire.errors.InputError` naming what is wrong (the receiver answers
400); a span that cannot be read (a bad trace id, say) is rejected alone and counted, the rest
of the request is kept (OTLP's partial success).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from tripwire.errors import InputError
from tripwire.otel.conventions import SpanView

__all__ = [
    "WANTED_PREFIXES",
    "BodyTooLarge",
    "Decoded",
    "decode_request",
    "decompress",
    "protobuf_backend",
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
"""Attribute key prefixes the decoder keeps (all the mapping reads, and ``service.name``)."""

MAX_DEPTH: Final = 32
"""Nested ``arrayValue``/``kvlistValue`` deeper than this are kept as ``None``."""

_ERROR_CODE: Final = 2  # STATUS_CODE_ERROR


class BodyTooLarge(InputError):
    """The request body is over the receiver's size limit (answered with 413)."""


@dataclass(slots=True)
class Decoded:
    """One decoded request: its spans, and how many spans were rejected and why."""

    views: list[SpanView] = field(default_factory=list)
    rejected: int = 0
    """Spans that could not be read (kept out, counted in the partial-success answer)."""
    message: str = ""
    """Why spans were rejected (the first reason), empty when none were."""

    def reject(self, why: str) -> None:
        self.rejected += 1
        if not self.message:
            self.message = why


def protobuf_backend() -> str:
    """The ``protobuf`` implementation in use: ``upb`` (fast), ``cpp`` or ``python`` (slow)."""
    try:
        from google.protobuf.internal import (  # type: ignore[import-untyped, unused-ignore]
            api_implementation,
        )

        return str(api_implementation.Type())
    except ImportError:  # pragma: no cover - protobuf comes with the otel extra
        return "missing"


def decompress(body: bytes, encoding: str | None, *, max_bytes: int) -> bytes:
    """The request body without its ``Content-Encoding`` (``gzip``, ``deflate`` or none).

    Raises:
        InputError: an unknown encoding, a corrupt stream, or more than ``max_bytes``
            decompressed (field ``body``; the receiver answers 413 for the size).
    """
    enc = (encoding or "identity").strip().lower()
    if enc in ("", "identity"):
        if len(body) > max_bytes:
            raise BodyTooLarge("body", f"{len(body)} bytes, over the limit of {max_bytes}")
        return body
    if enc not in ("gzip", "deflate", "x-gzip"):
        raise InputError("Content-Encoding", f"{enc!r} is not supported: send gzip, deflate or identity")
    wbits = 16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise InputError("body", f"corrupt {enc} data ({exc})") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise BodyTooLarge("body", f"over {max_bytes} bytes once decompressed")
    return out


def decode_request(body: bytes, content_type: str | None) -> Decoded:
    """Decode one ``ExportTraceServiceRequest``.

    Args:
        body: the (decompressed) body.
        content_type: ``application/x-protobuf`` or ``application/json``.

    Raises:
        InputError: an unsupported content type, or a body that is not an OTLP request.
    """
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind in ("application/x-protobuf", "application/protobuf"):
        return _decode_protobuf(body)
    if kind == "application/json":
        return _decode_json(body)
    raise InputError(
        "Content-Type", f"{kind or '(none)'} is not supported: send application/x-protobuf or application/json"
    )


# -- protobuf -------------------------------------------------------------------------------


def _decode_protobuf(body: bytes) -> Decoded:
    try:
        from google.protobuf.message import DecodeError  # type: ignore[import-untyped, unused-ignore]
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )
    except ImportError as exc:  # pragma: no cover - serve needs the otel extra
        raise InputError(
            "body", "decoding protobuf needs the otel extra: pip install 'tripwire[serve]'"
        ) from exc
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        raise InputError("body", f"not an OTLP ExportTraceServiceRequest in protobuf ({exc})") from None
    out = Decoded()
    views = out.views
    for rs in request.resource_spans:
        resource = _pb_attrs(rs.resource.attributes) if rs.HasField("resource") else None
        for ss in rs.scope_spans:
            scope = ss.scope.name if ss.HasField("scope") else None
            for span in ss.spans:
                tid = span.trace_id
                sid = span.span_id
                if len(tid) != 16 or len(sid) != 8 or tid == b"\x00" * 16:
                    out.reject("a span has an invalid trace_id or span_id")
                    continue
                parent = span.parent_span_id
                status = span.status
                failed = status.code == _ERROR_CODE
                exception_type = None
                if failed:
                    for event in span.events:
                        if event.name == "exception":
                            for kv in event.attributes:
                                if kv.key == "exception.type":
                                    exception_type = _pb_value(kv.value, 0)
                                    break
                            break
                start = span.start_time_unix_nano
                end = span.end_time_unix_nano
                views.append(
                    SpanView(
                        trace_id=tid.hex(),
                        span_id=sid.hex(),
                        parent_span_id=parent.hex() if len(parent) == 8 and parent != b"\x00" * 8 else None,
                        name=span.name,
                        start_s=start / 1e9 if start else None,
                        end_s=end / 1e9 if end else None,
                        status_error=failed,
                        status_message=status.message or None,
                        exception_type=exception_type if isinstance(exception_type, str) else None,
                        attributes=_pb_attrs(span.attributes),
                        resource_attributes=resource,
                        scope_name=scope,
                    )
                )
    return out


def _pb_attrs(kvs: Iterable[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        key = kv.key
        if key.startswith(WANTED_PREFIXES):
            out[key] = _pb_value(kv.value, 0)
    return out


def _pb_value(v: Any, depth: int) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if depth >= MAX_DEPTH:
        return None
    if which == "array_value":
        return [_pb_value(x, depth + 1) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return None


# -- JSON -----------------------------------------------------------------------------------


class _JValue(msgspec.Struct, omit_defaults=True):
    stringValue: str | None = None
    intValue: int | str | None = None
    boolValue: bool | None = None
    doubleValue: float | int | str | None = None
    arrayValue: Any = None
    kvlistValue: Any = None
    bytesValue: str | None = None


class _JKv(msgspec.Struct):
    key: str = ""
    value: _JValue | None = None


class _JStatus(msgspec.Struct):
    code: int | str | None = None
    message: str | None = None


class _JEvent(msgspec.Struct):
    name: str = ""
    attributes: list[_JKv] = []


class _JSpan(msgspec.Struct):
    traceId: str = ""
    spanId: str = ""
    parentSpanId: str | None = None
    name: str = ""
    startTimeUnixNano: int | str | None = None
    endTimeUnixNano: int | str | None = None
    attributes: list[_JKv] = []
    status: _JStatus | None = None
    events: list[_JEvent] = []


class _JScope(msgspec.Struct):
    name: str | None = None


class _JScopeSpans(msgspec.Struct):
    scope: _JScope | None = None
    spans: list[_JSpan] = []


class _JResource(msgspec.Struct):
    attributes: list[_JKv] = []


class _JResourceSpans(msgspec.Struct):
    resource: _JResource | None = None
    scopeSpans: list[_JScopeSpans] = []


class _JRequest(msgspec.Struct):
    resourceSpans: list[_JResourceSpans] = []


_JSON_DECODER: Final = msgspec.json.Decoder(_JRequest)


def _decode_json(body: bytes) -> Decoded:
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    try:
        request = _JSON_DECODER.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InputError("body", f"not an OTLP/JSON ExportTraceServiceRequest ({exc})") from None
    out = Decoded()
    for rs in request.resourceSpans:
        resource = _j_attrs(rs.resource.attributes) if rs.resource is not None else None
        for ss in rs.scopeSpans:
            scope = ss.scope.name if ss.scope is not None else None
            for span in ss.spans:
                tid = _hex_id(span.traceId, 16)
                sid = _hex_id(span.spanId, 8)
                if tid is None or sid is None:
                    out.reject("a span has an invalid traceId or spanId")
                    continue
                start = _nanos(span.startTimeUnixNano)
                end = _nanos(span.endTimeUnixNano)
                if start is False or end is False:
                    out.reject("a span has an unreadable start or end time")
                    continue
                status = span.status
                failed = status is not None and status.code in (2, "2", "STATUS_CODE_ERROR")
                exception_type = None
                if failed:
                    for event in span.events:
                        if event.name == "exception":
                            for kv in event.attributes:
                                if kv.key == "exception.type" and kv.value is not None:
                                    exception_type = kv.value.stringValue
                                    break
                            break
                out.views.append(
                    SpanView(
                        trace_id=tid,
                        span_id=sid,
                        parent_span_id=_hex_id(span.parentSpanId, 8) if span.parentSpanId else None,
                        name=span.name,
                        start_s=start,
                        end_s=end,
                        status_error=failed,
                        status_message=(status.message or None) if status is not None else None,
                        exception_type=exception_type,
                        attributes=_j_attrs(span.attributes),
                        resource_attributes=resource,
                        scope_name=scope,
                    )
                )
    return out


def _hex_id(text: str | None, nbytes: int) -> str | None:
    """A JSON id: OTLP/JSON says hex; some exporters write base64. ``None`` when invalid."""
    if not text:
        return None
    if len(text) == 2 * nbytes:
        try:
            raw = bytes.fromhex(text)
        except ValueError:
            raw = b""
        if raw and raw != b"\x00" * nbytes:
            return text.lower()
    import base64
    import binascii

    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != nbytes or raw == b"\x00" * nbytes:
        return None
    return raw.hex()


def _nanos(value: int | str | None) -> float | bool | None:
    """Seconds from a nanosecond count; ``None`` when absent; ``False`` when unreadable."""
    if value is None or value == "" or value == 0:
        return None
    if isinstance(value, str):
        if len(value) > 20 or not value.isdecimal():
            return False
        value = int(value)
    if value < 0 or value > 2**64:
        return False
    return value / 1e9


def _j_attrs(kvs: list[_JKv]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        key = kv.key
        if key.startswith(WANTED_PREFIXES) and kv.value is not None:
            out[key] = _j_value(kv.value, 0)
    return out


def _j_value(v: _JValue, depth: int) -> Any:
    if v.stringValue is not None:
        return v.stringValue
    if v.intValue is not None:
        if isinstance(v.intValue, str):
            text = v.intValue
            if len(text) <= 20 and text.lstrip("-").isdecimal():
                return int(text)
            return None
        return v.intValue
    if v.boolValue is not None:
        return v.boolValue
    if v.doubleValue is not None:
        try:
            return float(v.doubleValue)
        except (TypeError, ValueError, OverflowError):
            return None
    if depth >= MAX_DEPTH:
        return None
    if isinstance(v.arrayValue, dict):
        values = v.arrayValue.get("values") or []
        return [_j_raw(x, depth + 1) for x in values if isinstance(x, dict)]
    if isinstance(v.kvlistValue, dict):
        values = v.kvlistValue.get("values") or []
        return {
            x.get("key"): _j_raw(x.get("value"), depth + 1)
            for x in values
            if isinstance(x, dict) and isinstance(x.get("key"), str)
        }
    if v.bytesValue is not None:
        return v.bytesValue
    return None


def _j_raw(value: Any, depth: int) -> Any:
    """An ``AnyValue`` left as plain JSON (inside arrays and kvlists)."""
    if not isinstance(value, dict) or depth >= MAX_DEPTH:
        return None
    for key in ("stringValue", "boolValue"):
        if key in value:
            return value[key]
    if "intValue" in value:
        raw = value["intValue"]
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and len(raw) <= 20 and raw.lstrip("-").isdecimal():
            return int(raw)
        return None
    if "doubleValue" in value:
        try:
            return float(value["doubleValue"])
        except (TypeError, ValueError, OverflowError):
            return None
    if "arrayValue" in value and isinstance(value["arrayValue"], dict):
        return [_j_raw(x, depth + 1) for x in value["arrayValue"].get("values") or []]
    if "kvlistValue" in value and isinstance(value["kvlistValue"], dict):
        return {
            x.get("key"): _j_raw(x.get("value"), depth + 1)
            for x in value["kvlistValue"].get("values") or []
            if isinstance(x, dict) and isinstance(x.get("key"), str)
        }
    return None

