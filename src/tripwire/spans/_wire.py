"""The protobuf wire scanner of OTLP trace requests, in Python: the reference twin of
``_otlpscan.c``.

:func:`scan` walks the bytes of an ``ExportTraceServiceRequest`` and returns, per span, only
what the span mapping reads, without building a message object: the ids as hex, the times in
seconds, the name, the status, the first exception event's type, and the attributes whose key
is wanted (a prefix of ``prefixes`` or one of ``keys``), their values converted (``str``,
``int``, ``float``, ``bool``, ``bytes``, ``tuple`` for arrays, ``dict`` for kvlists). Every other
field is skipped by its length, unread.

The rules, the same in C (``tests/spans/test_otlpscan.py`` checks them against each other on
random and broken requests, and against ``opentelemetry-proto`` on valid ones):

- a broken envelope (the request, a ``ResourceSpans``, a ``ScopeSpans``, a resource or a scope:
  a truncated field, a varint over 10 bytes, field number 0, wire type 3, 4, 6 or 7, invalid
  UTF-8 in a string that is read) raises ``ValueError`` with one of the :data:`WHY` texts;
- the same inside one span rejects that span alone: its entry is the reason (a ``str``)
  instead of a tuple;
- a span whose trace id is not 16 bytes (or all zeros), or whose span id is neither empty nor
  8 bytes (or is all zeros: OpenTelemetry's invalid id), is rejected the same way
  (:data:`BAD_IDS`);
- a known field sent with another wire type is skipped like an unknown field; a singular field
  sent twice keeps its last value (a resource's attributes add up, as protobuf merges them);
- strings are decoded (UTF-8, strictly) only when returned: a skipped attribute is never read;
- ``arrayValue``/``kvlistValue`` nested deeper than ``max_depth`` become ``None`` and are counted.

A span's entry is ``(trace_id, span_id, parent_span_id, name, start_s, end_s, status_error,
status_message, exception_type, attributes, resource_attributes, scope_name)``; ``scan``
returns ``(entries, values cut at max_depth)``.
"""

from __future__ import annotations

import struct
from typing import Any, Final

__all__ = ["BAD_IDS", "WHY", "scan"]

TRUNCATED: Final = "truncated field"
LONG_VARINT: Final = "varint longer than 10 bytes"
FIELD_ZERO: Final = "field number 0"
WIRE_TYPE: Final = "unsupported wire type"
UTF8: Final = "invalid UTF-8"
WHY: Final = (TRUNCATED, LONG_VARINT, FIELD_ZERO, WIRE_TYPE, UTF8)
"""Every reason the scanner gives (a ``ValueError``'s text, or a rejected span's entry)."""
BAD_IDS: Final = "invalid trace_id or span_id"

_MASK64: Final = (1 << 64) - 1
_ZERO16: Final = bytes(16)
_ZERO8: Final = bytes(8)
_EXCEPTION: Final = b"exception"
_EXCEPTION_TYPE: Final = b"exception.type"
_DOUBLE: Final = struct.Struct("<d")
_U64: Final = struct.Struct("<Q")


class _Bad(Exception):
    pass


def _varint(b: bytes, i: int, end: int) -> tuple[int, int]:
    x = 0
    shift = 0
    while True:
        if i >= end:
            raise _Bad(TRUNCATED)
        c = b[i]
        i += 1
        x |= (c & 0x7F) << shift
        if c < 0x80:
            return x & _MASK64, i
        shift += 7
        if shift >= 70:
            raise _Bad(LONG_VARINT)


_BAD_WIRE_TYPES: Final = frozenset({3, 4, 6, 7})


def _tag(b: bytes, i: int, end: int) -> tuple[int, int, int]:
    if i < end:
        c = b[i]
        if c < 0x80:  # a one-byte tag (fields 1-15): most of them
            if c < 8:
                raise _Bad(FIELD_ZERO)
            if c & 7 in _BAD_WIRE_TYPES:
                raise _Bad(WIRE_TYPE)
            return c >> 3, c & 7, i + 1
    tag, i = _varint(b, i, end)
    if tag > 0xFFFFFFFF or tag >> 3 == 0:
        raise _Bad(FIELD_ZERO)
    wt = tag & 7
    if wt in _BAD_WIRE_TYPES:
        raise _Bad(WIRE_TYPE)
    return tag >> 3, wt, i


def _skip(b: bytes, wt: int, i: int, end: int) -> int:
    """Past one field's value of wire type ``wt``."""
    if wt == 0:
        return _varint(b, i, end)[1]
    if wt == 1:
        i += 8
    elif wt == 5:
        i += 4
    else:  # 2
        n, i = _varint(b, i, end)
        if n > end - i:
            raise _Bad(TRUNCATED)
        i += n
    if i > end:
        raise _Bad(TRUNCATED)
    return i


def _len(b: bytes, i: int, end: int) -> tuple[int, int]:
    """(start, end) of a length-delimited value."""
    if i < end and b[i] < 0x80:  # a length under 128 bytes
        n = b[i]
        i += 1
    else:
        n, i = _varint(b, i, end)
    if n > end - i:
        raise _Bad(TRUNCATED)
    return i, i + n


def _text(b: bytes, lo: int, hi: int) -> str:
    try:
        return b[lo:hi].decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(UTF8) from None


class _Ctx:
    __slots__ = ("deep", "keys", "max_depth", "prefixes")

    def __init__(self, prefixes: tuple[bytes, ...], keys: frozenset[bytes], max_depth: int) -> None:
        self.prefixes = prefixes
        self.keys = keys
        self.max_depth = max_depth
        self.deep = 0


def _value(b: bytes, i: int, end: int, depth: int, ctx: _Ctx) -> Any:
    """An ``AnyValue``: the last value field set wins."""
    if end - i >= 2 and b[i] == 0x0A and b[i + 1] < 0x80 and i + 2 + b[i + 1] == end:
        return _text(b, i + 2, end)  # a short string alone: the common case
    kind = 0
    lo = hi = 0
    num = 0
    while i < end:
        f, wt, i = _tag(b, i, end)
        if wt == 2 and f in (1, 5, 6, 7):
            kind = f
            lo, hi = _len(b, i, end)
            i = hi
        elif wt == 0 and f in (2, 3):
            kind = f
            num, i = _varint(b, i, end)
        elif wt == 1 and f == 4:
            if end - i < 8:
                raise _Bad(TRUNCATED)
            kind = 4
            lo = i
            i += 8
        else:
            i = _skip(b, wt, i, end)
    if kind == 1:
        return _text(b, lo, hi)
    if kind == 3:
        return num - (1 << 64) if num >= 1 << 63 else num
    if kind == 2:
        return num != 0
    if kind == 4:
        return _DOUBLE.unpack_from(b, lo)[0]
    if kind == 7:
        return b[lo:hi]
    if kind in (5, 6):
        if depth >= ctx.max_depth:
            ctx.deep += 1
            return None
        if kind == 5:
            items = []
            j = lo
            while j < hi:
                f, wt, j = _tag(b, j, hi)
                if f == 1 and wt == 2:
                    vlo, vhi = _len(b, j, hi)
                    items.append(_value(b, vlo, vhi, depth + 1, ctx))
                    j = vhi
                else:
                    j = _skip(b, wt, j, hi)
            return tuple(items)
        out: dict[str, Any] = {}
        j = lo
        while j < hi:
            f, wt, j = _tag(b, j, hi)
            if f == 1 and wt == 2:
                klo, khi = _len(b, j, hi)
                _kv_into(b, klo, khi, depth + 1, ctx, out, False)
                j = khi
            else:
                j = _skip(b, wt, j, hi)
        return out
    return None


def _kv_into(
    b: bytes, i: int, end: int, depth: int, ctx: _Ctx, out: dict[str, Any], filtered: bool
) -> None:
    """One ``KeyValue`` into ``out`` (when its key is wanted, if ``filtered``)."""
    if end - i >= 4 and b[i] == 0x0A and b[i + 1] < 0x80:
        # The common layout, read directly: a short key, then the value, and nothing else.
        khi = i + 2 + b[i + 1]
        if khi + 2 <= end and b[khi] == 0x12 and b[khi + 1] < 0x80 and khi + 2 + b[khi + 1] == end:
            key = b[i + 2 : khi]
            if filtered and not (key.startswith(ctx.prefixes) or key in ctx.keys):
                return
            name = _text(b, i + 2, khi)
            out[name] = _value(b, khi + 2, end, depth, ctx)
            return
    klo = khi = vlo = vhi = -1
    while i < end:
        f, wt, i = _tag(b, i, end)
        if wt == 2 and f in (1, 2):
            lo, hi = _len(b, i, end)
            if f == 1:
                klo, khi = lo, hi
            else:
                vlo, vhi = lo, hi
            i = hi
        else:
            i = _skip(b, wt, i, end)
    key = b"" if klo < 0 else b[klo:khi]
    if filtered and not (key.startswith(ctx.prefixes) or key in ctx.keys):
        return
    name = _text(b, klo, khi) if klo >= 0 else ""
    out[name] = _value(b, vlo, vhi, depth, ctx) if vlo >= 0 else None


def _attrs_into(b: bytes, lo: int, hi: int, ctx: _Ctx, out: dict[str, Any]) -> None:
    _kv_into(b, lo, hi, 0, ctx, out, True)


def _scope_name(b: bytes, i: int, end: int) -> tuple[int, int] | None:
    found = None
    while i < end:
        f, wt, i = _tag(b, i, end)
        if f == 1 and wt == 2:
            found = _len(b, i, end)
            i = found[1]
        else:
            i = _skip(b, wt, i, end)
    return found


def _exception_type(b: bytes, i: int, end: int) -> tuple[bool, tuple[int, int] | None]:
    """(the event is an ``exception``, where its ``exception.type`` string value is)."""
    is_exc = False
    found: tuple[int, int] | None = None
    seen = False
    while i < end:
        f, wt, i = _tag(b, i, end)
        if f == 2 and wt == 2:
            lo, hi = _len(b, i, end)
            is_exc = b[lo:hi] == _EXCEPTION
            i = hi
        elif f == 3 and wt == 2:
            lo, hi = _len(b, i, end)
            i = hi
            if seen:
                continue
            # KeyValue: is the key exception.type? then its value, if a string
            klo = khi = vlo = vhi = -1
            j = lo
            while j < hi:
                kf, kwt, j = _tag(b, j, hi)
                if kwt == 2 and kf in (1, 2):
                    a, z = _len(b, j, hi)
                    if kf == 1:
                        klo, khi = a, z
                    else:
                        vlo, vhi = a, z
                    j = z
                else:
                    j = _skip(b, kwt, j, hi)
            if klo >= 0 and b[klo:khi] == _EXCEPTION_TYPE:
                seen = True
                if vlo >= 0:
                    found = _string_value(b, vlo, vhi)
        else:
            i = _skip(b, wt, i, end)
    return is_exc, found


def _string_value(b: bytes, i: int, end: int) -> tuple[int, int] | None:
    """Where an ``AnyValue``'s string is, when a string is its (last) value."""
    found: tuple[int, int] | None = None
    while i < end:
        f, wt, i = _tag(b, i, end)
        if wt == 2 and f in (1, 5, 6, 7):
            lo, hi = _len(b, i, end)
            found = (lo, hi) if f == 1 else None
            i = hi
        elif (wt == 0 and f in (2, 3)) or (wt == 1 and f == 4):
            found = None
            i = _skip(b, wt, i, end)
        else:
            i = _skip(b, wt, i, end)
    return found


def _span(
    b: bytes, i: int, end: int, ctx: _Ctx, resource: dict[str, Any] | None, scope: str | None
) -> tuple[Any, ...] | str:
    tid = sid = parent = b""
    has_tid = False
    name = (0, 0)
    start = stop = 0
    code = 0
    msg: tuple[int, int] | None = None
    exc: tuple[int, int] | None = None
    exc_seen = False
    attrs: dict[str, Any] = {}
    while i < end:
        f, wt, i = _tag(b, i, end)
        if wt == 2:
            lo, hi = _len(b, i, end)
            i = hi
            if f == 9:
                _attrs_into(b, lo, hi, ctx, attrs)
            elif f == 1:
                tid = b[lo:hi]
                has_tid = True
            elif f == 2:
                sid = b[lo:hi]
            elif f == 4:
                parent = b[lo:hi]
            elif f == 5:
                name = (lo, hi)
            elif f == 11:
                if not exc_seen:
                    is_exc, found = _exception_type(b, lo, hi)
                    if is_exc:
                        exc_seen = True
                        exc = found
            elif f == 15:
                j = lo
                while j < hi:
                    sf, swt, j = _tag(b, j, hi)
                    if sf == 2 and swt == 2:
                        msg = _len(b, j, hi)
                        j = msg[1]
                    elif sf == 3 and swt == 0:
                        code, j = _varint(b, j, hi)
                    else:
                        j = _skip(b, swt, j, hi)
        elif wt == 1 and f in (7, 8):
            if end - i < 8:
                raise _Bad(TRUNCATED)
            if f == 7:
                start = _U64.unpack_from(b, i)[0]
            else:
                stop = _U64.unpack_from(b, i)[0]
            i += 8
        else:
            i = _skip(b, wt, i, end)
    if not has_tid or len(tid) != 16 or tid == _ZERO16 or len(sid) not in (0, 8) or sid == _ZERO8:
        return BAD_IDS
    text = _text(b, name[0], name[1])
    failed = (code & 0xFFFFFFFF) == 2
    message = (_text(b, msg[0], msg[1]) or None) if msg is not None else None
    exception_type = (_text(b, exc[0], exc[1]) or None) if failed and exc is not None else None
    return (
        tid.hex(),
        sid.hex(),
        parent.hex() if len(parent) == 8 and parent != _ZERO8 else None,
        text,
        start / 1e9 if start else None,
        stop / 1e9 if stop else None,
        failed,
        message,
        exception_type,
        attrs,
        resource,
        scope,
    )


def _scope_spans(
    b: bytes, i: int, end: int, ctx: _Ctx, resource: dict[str, Any] | None, out: list[Any]
) -> None:
    # The scope first (a field anywhere in the message), then the spans in order.
    j = i
    where = None
    while j < end:
        f, wt, j = _tag(b, j, end)
        if f == 1 and wt == 2:
            lo, hi = _len(b, j, end)
            where = _scope_name(b, lo, hi) or where
            j = hi
        else:
            j = _skip(b, wt, j, end)
    scope = (_text(b, where[0], where[1]) or None) if where is not None else None
    while i < end:
        f, wt, i = _tag(b, i, end)
        if f == 2 and wt == 2:
            lo, hi = _len(b, i, end)
            i = hi
            try:
                out.append(_span(b, lo, hi, ctx, resource, scope))
            except _Bad as exc:
                out.append(str(exc))
        else:
            i = _skip(b, wt, i, end)


def _resource_spans(b: bytes, i: int, end: int, ctx: _Ctx, out: list[Any]) -> None:
    resource: dict[str, Any] | None = None
    j = i
    while j < end:
        f, wt, j = _tag(b, j, end)
        if f == 1 and wt == 2:
            lo, hi = _len(b, j, end)
            j = hi
            if resource is None:
                resource = {}
            k = lo
            while k < hi:
                rf, rwt, k = _tag(b, k, hi)
                if rf == 1 and rwt == 2:
                    alo, ahi = _len(b, k, hi)
                    _attrs_into(b, alo, ahi, ctx, resource)
                    k = ahi
                else:
                    k = _skip(b, rwt, k, hi)
        else:
            j = _skip(b, wt, j, end)
    while i < end:
        f, wt, i = _tag(b, i, end)
        if f == 2 and wt == 2:
            lo, hi = _len(b, i, end)
            _scope_spans(b, lo, hi, ctx, resource, out)
            i = hi
        else:
            i = _skip(b, wt, i, end)


def scan(
    data: bytes, prefixes: tuple[bytes, ...], keys: frozenset[bytes], max_depth: int
) -> tuple[list[tuple[Any, ...] | str], int]:
    """The spans of one serialized ``ExportTraceServiceRequest`` (see the module docstring).

    Raises:
        ValueError: the request's envelope is broken (one of :data:`WHY`).
    """
    b = bytes(data)
    ctx = _Ctx(prefixes, keys, max_depth)
    out: list[Any] = []
    i, end = 0, len(b)
    try:
        while i < end:
            f, wt, i = _tag(b, i, end)
            if f == 1 and wt == 2:
                lo, hi = _len(b, i, end)
                _resource_spans(b, lo, hi, ctx, out)
                i = hi
            else:
                i = _skip(b, wt, i, end)
    except _Bad as exc:
        raise ValueError(str(exc)) from None
    return out, ctx.deep
