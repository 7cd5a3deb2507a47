"""Action signatures: the canonical identity of a tool call (tool name + canonical arguments).

Two calls are "the same action" when their signatures are equal. Arguments arrive as a dict,
as a JSON string, or as text that is not JSON; all three are reduced to one canonical byte
string and hashed (128 bits of SHA-256):

- keys are sorted, and *volatile* keys (timestamps, request ids, nonces…) are dropped at every
  depth;
- ``1`` and ``1.0`` are equal (integral floats become integers; integers wider than 64 bits stay
  exact: the JSON decoder used here never turns them into floats);
- ``NaN``/``Infinity`` get fixed tokens, cycles in a dict become a ``<cycle>`` token, nesting
  deeper than :data:`MAX_DEPTH` becomes a ``<depth>`` token (never a RecursionError);
- text that is not JSON is hashed as text (``ArgsKind.TEXT``); arguments larger than the cap
  (default 16 KiB) are hashed as raw bytes (``ArgsKind.RAW``), which bounds the cost of a call;
- missing arguments (capture switched off) give a name-only signature (``ArgsKind.ABSENT``),
  which callers must treat as a weaker key.

The trap: a normalizer change makes every signature change, which looks like a run that
suddenly stopped repeating. :attr:`Normalizer.version` names everything that affects the
digest; record it with every verdict.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from tripwire.core.reasons import ArgsKind
from tripwire.errors import ConfigError

__all__ = [
    "ABSENT",
    "DEFAULT_NORMALIZER",
    "DEFAULT_VOLATILE_KEYS",
    "MAX_CANONICAL_BYTES",
    "MAX_DEPTH",
    "Normalizer",
    "Signature",
    "signature_of",
]

NORMALIZER_SCHEME: Final = "n1r2"
"""Bump when the canonical form of arguments (n…) or results (r…) changes in a way the fields
of :class:`Normalizer` don't show."""

DEFAULT_VOLATILE_KEYS: Final = frozenset(
    {
        "timestamp",
        "request_id",
        "trace_id",
        "span_id",
        "nonce",
        "now",
        "_ts",
        "correlation_id",
    }
)
"""Keys dropped at every depth by default: they change on every call without changing the action."""

MAX_CANONICAL_BYTES: Final = 16 * 1024
"""Arguments larger than this (as UTF-8 JSON/text) are hashed as raw bytes, not canonicalized."""

MAX_DEPTH: Final = 64
"""Containers nested deeper than this are replaced by a fixed ``<depth>`` token."""


class _Absent:
    """Marker for "no arguments were recorded" (distinct from ``None``, a JSON null)."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()
"""Pass as ``arguments`` when the emitter did not record them."""

_NAN: Final = "\x00NaN"
_POS_INF: Final = "\x00Infinity"
_NEG_INF: Final = "\x00-Infinity"
_CYCLE: Final = "\x00<cycle>"
_DEPTH: Final = "\x00<depth>"

_ENCODER: Final = msgspec.json.Encoder(order="sorted")


def _float_token(value: float) -> float | int | str:
    if value != value:
        return _NAN
    if math.isinf(value):
        return _POS_INF if value > 0 else _NEG_INF
    if value.is_integer():
        return int(value)
    return value


def _float_hook(text: str) -> float | int | str:
    # Called by the JSON decoder for every non-integer number (and integers it cannot hold
    # natively): keep integers exact, make 1.0 equal to 1.
    if "." not in text and "e" not in text and "E" not in text:
        return int(text)
    return _float_token(float(text))


_DECODER: Final = msgspec.json.Decoder(float_hook=_float_hook)


class Signature(msgspec.Struct, frozen=True):
    """The identity of one tool call. Equal signatures mean "the same action".

    A frozen ``msgspec.Struct`` (built on every call; far cheaper than a frozen dataclass).
    """

    tool: str
    """The tool's name, as given."""
    key: int
    """128-bit digest of tool name, argument kind and canonical arguments (the window key)."""
    kind: ArgsKind
    """How the arguments were read; ``ABSENT`` means the key is the tool name only."""

    @property
    def digest(self) -> str:
        """The key as 32 hex characters (use a prefix of it in messages, never the arguments)."""
        return f"{self.key:032x}"

    @property
    def name_only(self) -> bool:
        """True when no arguments were recorded, so the signature cannot tell calls apart."""
        return self.kind is ArgsKind.ABSENT


_DIGITS: Final = b"0123456789"

_TOOL_KEYS: dict[str, int] = {}
_TOOL_KEYS_MAX: Final = 4096


_PREFIXES: dict[tuple[str, ArgsKind], bytes] = {}
_RESULT_PREFIX: Final = b"\x00result\x00"


def _hash(tool: str, kind: ArgsKind, payload: bytes) -> int:
    """128 bits of SHA-256 over ``tool NUL kind NUL payload``."""
    prefix = _PREFIXES.get((tool, kind))
    if prefix is None:
        if len(_PREFIXES) >= _TOOL_KEYS_MAX:
            _PREFIXES.clear()  # a pure cache: bounded, and correct when emptied
        prefix = _PREFIXES[(tool, kind)] = (
            tool.encode("utf-8", "surrogatepass") + b"\x00" + kind.value.encode() + b"\x00"
        )
    return int.from_bytes(hashlib.sha256(prefix + payload).digest()[:16], "big")


@dataclass(frozen=True, slots=True)
class Normalizer:
    """Turns (tool, arguments) into a :class:`Signature`. Immutable and stateless.

    Make variants with :meth:`with_volatile_keys`; every field is part of :attr:`version`.
    """

    volatile_keys: frozenset[str] = DEFAULT_VOLATILE_KEYS
    """Keys dropped at every depth of the arguments."""
    max_bytes: int = MAX_CANONICAL_BYTES
    """Arguments above this many bytes are hashed as raw bytes (``ArgsKind.RAW``)."""
    version: str = field(init=False, compare=False)
    """Names the scheme, the volatile keys and the cap: record it with every verdict."""
    _needles: tuple[str, ...] = field(init=False, compare=False, repr=False)
    _needle_re: re.Pattern[str] = field(init=False, compare=False, repr=False)
    _needle_re_b: re.Pattern[bytes] = field(init=False, compare=False, repr=False)
    _escapes_b: tuple[bytes, ...] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.volatile_keys, frozenset):
            object.__setattr__(self, "volatile_keys", frozenset(self.volatile_keys))
        if not all(isinstance(k, str) and k for k in self.volatile_keys):
            raise ConfigError("volatile_keys", sorted(map(repr, self.volatile_keys)), "non-empty strings")
        if not isinstance(self.max_bytes, int) or self.max_bytes < 64:
            raise ConfigError("max_bytes", self.max_bytes, "an integer >= 64")
        keys_digest = hashlib.sha256("\x00".join(sorted(self.volatile_keys)).encode()).hexdigest()[:8]
        version = f"{NORMALIZER_SCHEME}+vk.{keys_digest}+cap.{self.max_bytes}"
        object.__setattr__(self, "version", version)
        # A volatile key can only be present if its quoted form occurs in the JSON text: a cheap
        # scan lets the common case skip the Python-level walk entirely. One regex whose literal
        # prefix is the quote ('"(?:nonce|now|…)"') runs the scan in C, jumping from quote to
        # quote; an alternation of whole needles would try every needle at every byte (8x
        # slower on 10 KB). JSON may also spell a key with escapes ("\u006eonce" is "nonce"):
        # a backslash (rare, so found at memchr speed) followed by an escape that could hide a
        # key forces the walk too.
        keys = sorted(self.volatile_keys, key=lambda k: (-len(k), k))
        escapes = ["\\u"]
        if any("/" in k for k in keys):
            escapes.append("\\/")
        if any(c in '"\\' or c < " " for k in keys for c in k):
            escapes.append("\\")
        object.__setattr__(self, "_needles", tuple([f'"{k}"' for k in keys] + escapes))
        pattern = '"(?:' + "|".join(re.escape(k) for k in keys) + ')"' if keys else "(?!)"
        object.__setattr__(self, "_needle_re", re.compile(pattern))
        object.__setattr__(self, "_needle_re_b", re.compile(pattern.encode("utf-8", "surrogatepass")))
        object.__setattr__(self, "_escapes_b", tuple(e.encode() for e in escapes))

    def _may_hold_volatile(self, raw: bytes) -> bool:
        """True when the JSON text ``raw`` may hold a volatile key (so it must be walked)."""
        if self._needle_re_b.search(raw) is not None:
            return True
        return b"\\" in raw and any(e in raw for e in self._escapes_b)

    def with_volatile_keys(
        self, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> Normalizer:
        """A normalizer with volatile keys added and/or removed."""
        keys = (self.volatile_keys | frozenset(add)) - frozenset(remove)
        return Normalizer(volatile_keys=keys, max_bytes=self.max_bytes)

    # -- signatures -------------------------------------------------------------------------

    def signature(self, tool: str, arguments: Any = ABSENT) -> Signature:
        """The signature of ``tool`` called with ``arguments``.

        Args:
            tool: the tool's name.
            arguments: a mapping, a JSON string (or bytes), any other text, or :data:`ABSENT`
                when the emitter recorded none. Other values are canonicalized like JSON
                values (lists, numbers, ``None``…).

        Never raises for any argument value: hostile input gets a defined signature.
        """
        kind, payload = self.canonical(arguments)
        return Signature(tool, _hash(tool, kind, payload), kind)

    def tool_signature(self, tool: str) -> Signature:
        """The name-only signature of ``tool`` (what the ``tool`` key mode compares)."""
        key = _TOOL_KEYS.get(tool)
        if key is None:
            if len(_TOOL_KEYS) >= _TOOL_KEYS_MAX:
                _TOOL_KEYS.clear()  # a pure cache: bounded, and correct when emptied
            key = _TOOL_KEYS[tool] = _hash(tool, ArgsKind.ABSENT, b"")
        return Signature(tool, key, ArgsKind.ABSENT)

    def canonical(self, value: Any) -> tuple[ArgsKind, bytes]:
        """The argument kind and canonical bytes of ``value`` (what the digest is taken of)."""
        if value is ABSENT:
            return ArgsKind.ABSENT, b""
        if value is None:
            # Emitters record "no arguments" as None as often as they leave them out.
            return ArgsKind.ABSENT, b""
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            return self._canonical_text(value)
        return self._canonical_object(value)

    def digest(self, value: Any) -> str:
        """A 128-bit hex digest of a value normalized like arguments."""
        kind, payload = self.canonical(value)
        return f"{_hash('', kind, payload):032x}"

    def result_digest(self, value: Any) -> str:
        """The digest of a tool *result*, as progress evidence.

        Digits are removed before hashing: counters, timestamps, durations, a shell's line
        numbers and the new order id in every result of a side-effecting tool change on every
        call without being new evidence, so a result that differs only in numbers is the same
        result. Mappings are canonicalized like arguments; text is canonicalized only when it
        is JSON carrying a volatile key (results of one tool come from one piece of code, so
        their key order is stable, and parsing every result would cost more than the rest of
        the call's bookkeeping).
        """
        if value is ABSENT or value is None:
            payload = b""
        elif isinstance(value, (str, bytes, bytearray, memoryview)):
            raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
            volatile = self._may_hold_volatile(raw)
            payload = self._canonical_text(raw)[1] if volatile else raw
        else:
            payload = self._canonical_object(value)[1]
        return hashlib.sha256(_RESULT_PREFIX + payload.translate(None, _DIGITS)).hexdigest()[:32]

    def _canonical_text(self, text: str | bytes | bytearray | memoryview) -> tuple[ArgsKind, bytes]:
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if len(raw) > self.max_bytes:
            return ArgsKind.RAW, raw
        stripped = raw.lstrip()
        if not stripped or stripped[:1] not in b'{["-0123456789tfn':
            # Not JSON (most free text starts with a letter other than t/f/n): skip the parser.
            return ArgsKind.TEXT, raw
        try:
            obj = _DECODER.decode(raw)
        except (msgspec.DecodeError, RecursionError, ValueError):
            return ArgsKind.TEXT, raw
        if self._may_hold_volatile(raw):
            obj = self._normalize(obj)
        try:
            return ArgsKind.JSON, _ENCODER.encode(obj)
        except RecursionError:
            # Valid JSON nested deeper than the encoder goes: fall back to the text itself.
            return ArgsKind.TEXT, raw

    def _canonical_object(self, value: Any) -> tuple[ArgsKind, bytes]:
        obj = self._normalize(value)
        try:
            payload = _ENCODER.encode(obj)
        except (TypeError, msgspec.EncodeError, RecursionError, OverflowError, UnicodeEncodeError):
            # Lone surrogates in a string (json.loads lets them through) are not UTF-8: use the
            # stdlib encoder, which escapes them and still sorts keys.
            payload = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=repr).encode()
        # Already canonical (the walk is done), so the cap does not apply: a mapping above it
        # keeps kind JSON, while the same arguments as a JSON string above the cap are RAW.
        return ArgsKind.JSON, payload

    def _normalize(self, value: Any) -> Any:
        """A JSON-ready copy of ``value``: volatile keys dropped, numbers and oddities fixed."""
        volatile = self.volatile_keys
        active: set[int] = set()

        def walk(v: Any, depth: int) -> Any:
            if v is None or isinstance(v, (str, bool)):
                return v
            if isinstance(v, int):
                return int(v)
            if isinstance(v, float):
                return _float_token(v)
            if depth >= MAX_DEPTH:
                return _DEPTH
            if isinstance(v, Mapping):
                vid = id(v)
                if vid in active:
                    return _CYCLE
                active.add(vid)
                try:
                    out: dict[str, Any] = {}
                    for k, item in v.items():
                        sk = k if isinstance(k, str) else _key_text(k)
                        if sk in volatile:
                            continue
                        out[sk] = walk(item, depth + 1)
                    return out
                finally:
                    active.discard(vid)
            if isinstance(v, (list, tuple)):
                vid = id(v)
                if vid in active:
                    return _CYCLE
                active.add(vid)
                try:
                    return [walk(item, depth + 1) for item in v]
                finally:
                    active.discard(vid)
            if isinstance(v, (set, frozenset)):
                items = [walk(item, depth + 1) for item in v]
                return sorted(items, key=lambda x: _ENCODER.encode(x))
            if isinstance(v, (bytes, bytearray, memoryview)):
                return "\x00bytes:" + hashlib.sha256(bytes(v)).hexdigest()
            return _object_token(v)

        return walk(value, 0)


def _key_text(key: Any) -> str:
    if isinstance(key, float):
        key = _float_token(key)
    return str(key)


def _object_token(value: Any) -> str:
    # Arbitrary objects (dataclasses, pydantic models, enums…) are identified by type and str().
    # str() of a hostile object may raise; the signature must not.
    try:
        text = str(value)
    except Exception:
        text = "<unprintable>"
    return f"\x00{type(value).__qualname__}:{text}"


DEFAULT_NORMALIZER: Final = Normalizer()
"""The normalizer used when none is given."""


def signature_of(tool: str, arguments: Any = ABSENT, normalizer: Normalizer | None = None) -> Signature:
    """The signature of ``tool`` called with ``arguments`` under ``normalizer`` (default one).

    >>> signature_of("search", {"q": "x", "request_id": 7}) == signature_of("search", '{"q":"x"}')
    True
    """
    return (normalizer or DEFAULT_NORMALIZER).signature(tool, arguments)
