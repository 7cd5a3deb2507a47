"""The receiver's decoding: :mod:`tripwire.spans.otlp` (the decoder replay uses too), and the
``protobuf`` backend check the service logs at start-up."""

from __future__ import annotations

from tripwire.spans.otlp import (
    MAX_DEPTH,
    WANTED_KEYS,
    WANTED_PREFIXES,
    BodyTooLarge,
    Decoded,
    decode_request,
    decompress,
)

__all__ = [
    "MAX_DEPTH",
    "WANTED_KEYS",
    "WANTED_PREFIXES",
    "BodyTooLarge",
    "Decoded",
    "decode_request",
    "decompress",
    "protobuf_backend",
]


def protobuf_backend() -> str:
    """The ``protobuf`` implementation in use: ``upb`` (fast), ``cpp`` or ``python`` (slow).

    The receiver reads protobuf with tripwire's own wire scanner; ``protobuf`` still encodes
    its answers (and the stock exporters' requests in the tests).
    """
    try:
        from google.protobuf.internal import (  # type: ignore[import-untyped, unused-ignore]
            api_implementation,
        )

        return str(api_implementation.Type())
    except ImportError:  # pragma: no cover - protobuf comes with the otel extra
        return "missing"
