"""Action signatures: the canonical identity of a tool call (tool name + canonical arguments).

Two calls are "the same action" when their signatures are equal. Arguments arrive as a dict,
as a JSON string, or as text that is not JSON; all three are reduced to one canonical byte
string and hashed with XXH3-128, seeded by the tool name and the argument kind (so equal
payloads of different tools or kinds never meet). XXH3 is a fast non-cryptographic 128-bit
hash: accidental collisions are negligible, and the digest keeps arguments out of storage, but
it is not a secret and not a defence against someone crafting colliding arguments.

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

The canonical bytes are MessagePack with sorted keys (strings are copied, not escaped: several
times faster than JSON on text-heavy arguments). A value MessagePack cannot hold (an integer
wider than 64 bits, a lone surrogate, a ``str`` subclass…) is written as sorted JSON behind a
tag byte that never starts a MessagePack document, so the two forms never produce equal bytes
for different values. A dict and its JSON string reach the same normalized value, hence the
same form and the same bytes.

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
import xxhash

from tripwire.core._compiled import resultmask, speedups
from tripwire.core.reasons import ArgsKind
from tripwire.errors import ConfigError

__all__ = [
    "ABSENT",
    "DEFAULT_NORMALIZER",
    "DEFAULT_VOLATILE_KEYS",
    "EMPTY_RESULT",
    "MAX_CANONICAL_BYTES",
    "MAX_DEPTH",
    "VOLATILE_TEXT",
    "Normalizer",
    "Signature",
    "signature_of",
]

NORMALIZER_SCHEME: Final = "n3r5"
"""Bump when the canonical form of arguments (n…) or results (r…) changes in a way the fields
of :class:`Normalizer` don't show (r5: hex ids that start with a letter, dates with slashes,
compound durations, memory addresses, request ids written out and temporary names are
volatile too; n3: a ``str`` or ``float`` subclass in a mapping, such as ``numpy.float64``,
signs as the plain value, and JSON text nested deeper than :data:`MAX_DEPTH` is cut there:
both now sign as the same arguments given the other way, as a mapping or as JSON text)."""

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

_JSON: Final = ArgsKind.JSON
_TEXT: Final = ArgsKind.TEXT
_RAW: Final = ArgsKind.RAW
_ABSENT_KIND: Final = ArgsKind.ABSENT

_ENCODER: Final = msgspec.json.Encoder(order="sorted")
_encode_msgpack: Final = msgspec.msgpack.Encoder(order="sorted").encode

# Canonical argument bytes are one MessagePack document, or one of these tags followed by JSON.
# 0xC1 is the one byte MessagePack never uses, so a tagged payload is never a MessagePack one.
_JSON_TAG: Final = b"\xc1j"
"""msgspec's sorted JSON: values MessagePack cannot hold (integers wider than 64 bits)."""
_PYJSON_TAG: Final = b"\xc1p"
"""The stdlib's sorted, ASCII-escaped JSON: strings with lone surrogates."""
_HEXINT_TAG: Final = b"\xc1x"
"""As ``_PYJSON_TAG``, integers too long for decimal text written in hex."""
_OPAQUE_TAG: Final = b"\xc1?"
"""Nothing could encode the value (not reachable from a normalized value; never raise)."""

_xxh3_128: Final = xxhash.xxh3_128_intdigest
_xxh3_128_hex: Final = xxhash.xxh3_128_hexdigest
_xxh3_64: Final = xxhash.xxh3_64_intdigest


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
    if "." in text or "e" in text or "E" in text:
        value = float(text)
        if value.is_integer():
            return int(value)
        if value - value == 0.0:  # finite: the common case
            return value
        return _float_token(value)  # overflowed to an infinity (1e400)
    return int(text)


_decode_json: Final = msgspec.json.Decoder(float_hook=_float_hook).decode

_decode_plain: Final = msgspec.json.Decoder().decode
"""The JSON decoder without :func:`_float_hook` (which runs Python code for every non-integer
number: about 1 µs each). Used only ahead of the compiled :data:`_canonical`, which writes an
integral float as its integer and returns ``None`` where the two decoders could disagree: the
canonical bytes are then those of :data:`_decode_json`'s value. The two differ only on
integral floats (``1.0`` vs ``1``: the same canonical bytes) and on a number out of a float's
range (``1e400``), which this one refuses: the caller then decodes with the hook."""

_SCAN_BELOW: Final = 640
"""Below this many bytes of JSON, the regex scan for volatile keys beats walking the decoded
value in Python (measured on typical arguments); above, the walk wins, by far on large ones. The
compiled walk (:data:`_volatile_free`) beats the scan at every size."""

_volatile_free: Final = getattr(speedups(), "volatile_free", None)
"""The compiled walk of :meth:`Normalizer._holds_no_volatile` (``None`` without the accelerator):
``(obj, keys, budget) -> True / False / None when over budget``."""

# First bytes of a JSON document, its leading whitespace included (other text skips the parser).
_JSON_FIRST: Final = frozenset(b'{["-0123456789tfn \t\n\r')
_JSON_FIRST_CHARS: Final = frozenset('{["-0123456789tfn \t\n\r')
_OPENERS: Final = frozenset((b"{", b"[", b'"'))
"""The first bytes (after whitespace) of a JSON document that a result digest may parse: an
object or an array (which can hold a volatile key), or a string (an escape in it, such as
``\\u``, sends it through the parser, which writes it again)."""


def _encode_fallback(obj: Any) -> bytes | None:
    """Tagged JSON for a normalized value MessagePack cannot hold (``None`` if nothing can)."""
    try:
        return _JSON_TAG + _ENCODER.encode(obj)
    except Exception:  # UnicodeEncodeError, TypeError, ValueError…
        pass
    try:
        # Lone surrogates in a string (json.loads lets them through) are not UTF-8: the stdlib
        # encoder escapes them and still sorts keys.
        return _PYJSON_TAG + json.dumps(obj, sort_keys=True, ensure_ascii=True, default=repr).encode()
    except ValueError:
        pass  # an integer beyond the interpreter's limit for decimal text
    except Exception:
        return None
    try:
        return _HEXINT_TAG + json.dumps(
            _hex_ints(obj, 0), sort_keys=True, ensure_ascii=True, default=repr
        ).encode()
    except Exception:
        return None


def _hex_ints(value: Any, depth: int) -> Any:
    # Integers too long for str() (sys.get_int_max_str_digits) become hex tokens.
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**64) < value < 2**64:
        return f"\x00int:{value:x}"
    if depth > MAX_DEPTH:
        return value
    if isinstance(value, dict):
        return {k: _hex_ints(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_ints(v, depth + 1) for v in value]
    return value


def _encode(obj: Any) -> bytes:
    """The canonical bytes of a normalized value (never raises)."""
    try:
        return _encode_msgpack(obj)
    except Exception:  # OverflowError, UnicodeEncodeError, TypeError…
        payload = _encode_fallback(obj)
        return _OPAQUE_TAG if payload is None else payload


def _json_bytes(obj: Any) -> bytes:
    """Sorted JSON of a normalized value (result digests strip digits from it: keep it text)."""
    try:
        return _ENCODER.encode(obj)
    except Exception:
        payload = _encode_fallback(obj)
        return _OPAQUE_TAG if payload is None else payload


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

_UNIT: Final = rb"(?:ns|us|\xc2\xb5s|ms|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?)(?![A-Za-z0-9_])"

VOLATILE_TEXT: Final = (
    rb"(?<=sh: line \d)\d*(?=:)",  # a shell's command counter (bash: line 32619: cd: ...)
    # date, ISO time (also in a file name: run_2026-12-01_10-00-00)
    rb"(?<![0-9A-Za-z.]\d)\d{3}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?|[T_]\d\d-\d\d-\d\d)?",
    rb"(?<![\w./]\d)(?:\d?/\d\d?/\d\d(?:\d\d)?|\d{3}/\d\d?/\d\d?)(?![\w/])",  # date with slashes
    rb"(?<![\w.:]\d)\d?:\d\d(?::\d\d(?:[.,]\d+)?)?(?![\w:])",  # clock time
    rb"(?<![\w.-]\d)[0-9a-fA-F]{7}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-])",  # UUID
    rb"(?<![\w.]\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{7,}(?:-[0-9a-fA-F]{4,})*(?![\w-])",  # hex id, UUID
    rb"(?<![\w.]0)(?<=0)x[0-9a-fA-F]{6,}(?!\w)",  # a memory address (0x7f3a2b1c4d50)
    rb"(?<![\w.]\d)\d{3,}(?:\.\d+)?(?![\w.])",  # a number of 4+ digits: an id, a year, an epoch time
    rb"(?<![\w.]\d)\d*(?:\.\d+)?\s?" + _UNIT,  # duration
    rb"(?<![\w.]\d)\d*(?:h\d+m(?:\d+(?:\.\d+)?s)?|m\d+(?:\.\d+)?s)(?![A-Za-z0-9_])",  # 1m23s, 2h5m
    rb"(?=(?:[A-Za-z]*\d){3})(?=\d*[A-Za-z])[A-Za-z0-9]{15,}(?![A-Za-z0-9])",  # request / random id
    # a word of 10+ letters and digits that mixes 3+ digits, 2+ upper and lower case (8fK2mZpQ1xL9)
    rb"(?<![A-Za-z0-9]\d)(?=(?:[A-Za-z]*\d){2})(?=(?:[0-9a-z]*[A-Z]){2})(?=[0-9A-Z]*[a-z])[A-Za-z0-9]{9,}(?![A-Za-z0-9])",
)
"""What a short result may carry that changes on every call without being new evidence, in
matches that start at a digit (:data:`VOLATILE_WORDS` holds those that can start at a letter).
Every match is replaced by one fixed token before hashing (``Normalizer.result_digest``): a
timestamp, date (ISO or with slashes) or clock time, a duration with its unit (``0.53s``,
``1m23s``), a hex id or UUID (8+ characters), a memory address, a number of 4+ digits (epoch
times, fresh ids), a shell's command counter, and random letter-and-digit tokens (request
ids)."""

VOLATILE_WORDS: Final = (
    # a UUID that starts with a letter, in any case, digits or not
    rb"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-])",
    # a hex id that starts with a letter: 8+ characters with a digit somewhere (deadbeef-12ab),
    # or 12+ hex letters with none (deadbeefcafe)
    rb"(?=[a-fA-F])(?:(?=[0-9a-fA-F-]*\d)[0-9a-fA-F]{8,}(?:-[0-9a-fA-F]{4,})*|[a-fA-F]{12,})(?![\w-])",
    # a random token: 16+ letters and digits (3+ of them digits), or 10+ mixing lower case,
    # upper case (2+) and 3+ digits (reqK8fK2mZpQ1xL9)
    rb"(?=(?:[A-Za-z]*\d){3})(?:(?=\d*[A-Za-z])[A-Za-z0-9]{16,}|(?=(?:[0-9a-z]*[A-Z]){2})(?=[0-9A-Z]*[a-z])[A-Za-z0-9]{10,})(?![A-Za-z0-9])",
    # the value of a request, trace, span or correlation id written out in text
    rb"(?i:(?:x-)?(?:request|req|trace|span|correlation)[ _-]?id)[\"']? ?[:=]\s*[\"']?[\w.-]+",
    rb"tmp[a-z0-9_]{8}(?![A-Za-z0-9_])",  # a temporary file's name (Python's tempfile)
)
"""The volatile values whose match starts at a letter, at the start of a word: a UUID or hex id
that starts with a letter (``deadbeefcafe``, ``abcdefab-…``), a random token, a request /
trace id written out as ``request_id: …``, and a temporary file's name."""

_VOLATILE_DIGITS_RE: Final = re.compile(rb"\d(?:" + b"|".join(VOLATILE_TEXT) + rb")")
_VOLATILE_WORDS_RE: Final = re.compile(rb"(?<![0-9A-Za-z])(?=[A-Za-z])(?:" + b"|".join(VOLATILE_WORDS) + rb")")
_VOLATILE_TEXT_RE: Final = re.compile(_VOLATILE_DIGITS_RE.pattern + b"|" + _VOLATILE_WORDS_RE.pattern)
"""Every volatile value of a short result: :data:`VOLATILE_TEXT` and :data:`VOLATILE_WORDS`."""

_LETTERS: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_SHAPES: Final = bytes.maketrans(_LETTERS + _DIGITS, b"a" * 52 + b"0" * 10)
"""Letters to ``a``, digits to ``0``: where a letter meets a digit, at C speed."""
_HEX_LETTERS: Final = bytes.maketrans(b"abcdefABCDEFhH", b"h" * 12 + b"xx")
_ID_KEY_RE: Final = re.compile(rb"id[\"']? ?[:=]")


def _may_hold_words(payload: bytes, digits: bool) -> bool:
    """False when no pattern of :data:`VOLATILE_WORDS` can match ``payload`` (``digits``: it
    holds one). Each needs a letter followed by a digit, 8 hex letters in a row (a hex id with no
    digit in its first group), ``tmp``, or an ``id:`` key: a few C-level scans, against a regex
    that tries every word."""
    if digits:
        shapes = payload.translate(_SHAPES)
        if b"a0" in shapes:
            return True
    return (
        b"hhhhhhhh" in payload.translate(_HEX_LETTERS)
        or b"tmp" in payload
        or _ID_KEY_RE.search(payload.lower()) is not None
    )


def _mask_volatile(payload: bytes) -> bytes:
    """``_VOLATILE_TEXT_RE.sub(b"\\x00v", payload)``: every volatile value of a short result
    replaced by one fixed token. Most results hold none, and the sub tries every pattern at every
    digit and word: C-level scans first tell which half of the pattern can match, if any."""
    if len(payload.translate(None, _DIGITS)) == len(payload):  # no digit: only a word can be volatile
        if not _may_hold_words(payload, False):
            return payload
        return _VOLATILE_WORDS_RE.sub(b"\x00v", payload)
    if not _may_hold_words(payload, True):
        return _VOLATILE_DIGITS_RE.sub(b"\x00v", payload)
    return _VOLATILE_TEXT_RE.sub(b"\x00v", payload)


_mask: Final = getattr(resultmask(), "mask", None)
"""The compiled twin of :func:`_mask_volatile` (``None`` without the accelerator): ``payload ->
bytes``, in one pass over the payload, or ``None`` for a payload above 4 KiB, which it leaves to
the twin (see ``_resultmask.c``)."""
_prepare: Final = getattr(resultmask(), "prepare", None)
"""The compiled common path of :meth:`Normalizer.result_digest` for a result text (``None``
without the accelerator): ``(text, max_bytes) -> bytes`` to hash, or ``None`` when the text may
hold a JSON document or say "found nothing" (then the Python path below answers)."""
_strip_digits: Final = getattr(resultmask(), "strip_digits", None)
"""The compiled twin of ``payload.translate(None, _DIGITS)`` (``None`` without the accelerator):
about a quarter of its instructions per byte of a long result."""


EMPTY_RESULT: Final = xxhash.xxh3_128_hexdigest(b"\x00nothing\x00", xxhash.xxh3_64_intdigest(b"\x00result\x00"))
"""The digest of every result that found nothing: no output, an empty JSON value, or a short
"no matches" / "not found" message (``Normalizer.result_digest``)."""

_SHORT: Final = 200
"""Results longer than this (in bytes) lose every digit before hashing; shorter ones keep their
numbers and lose only what :data:`VOLATILE_TEXT` matches. In a long result (a file view, a
build log, a page of JSON), a number that changed while the rest did not (the line count of a
file the same edit keeps growing) is not new evidence; in a short one (a status line, ``line
3``, ``45% done``) the number is the news."""

_EMPTY_MAX: Final = 160
"""Only results this short (in bytes, after canonicalization) can be "found nothing" messages."""

_EMPTY_RE: Final = re.compile(
    rb"\s*(?:"
    rb'|\[\s*\]|\{\s*\}|null|none|""|' + rb"''"
    rb"|(?:no|0|zero)\s+(?:\S+\s+){0,2}?(?:match(?:es)?|results?|hits|entries|items|records|rows|files|documents)\b.*"
    rb"|nothing\s+(?:was\s+)?found\b.*"
    rb"|.{0,120}\bnot\s+found[.!]?"
    rb")\s*\Z",
    re.IGNORECASE | re.DOTALL,
)

_EMPTY_STARTS: Final = frozenset((b"no", b"0 ", b"ze"))
"""How a "found nothing" message without the word "found" starts (a cheap test before the regex)."""

_SEEDS_MAX: Final = 4096
"""Entries per module-level cache (a pure cache: emptied when full, correct when empty)."""
_CACHED_NAME_MAX: Final = 256
"""Tool names longer than this are never cached: each cache holds at most ``_SEEDS_MAX`` names
of at most this many characters, so a run of huge distinct names cannot grow memory."""
_TEXT_CACHE_MAX: Final = 512
"""Signatures of argument text each :class:`Normalizer` remembers (a pure cache keyed by the
exact tool name and text: emptied when full, correct when empty)."""
_CACHED_TEXT_MAX: Final = 2048
"""Argument texts longer than this (in bytes of the string's storage: characters for ASCII
text, up to four bytes each otherwise) are never cached, nor a call whose tool name is longer
than :data:`_CACHED_NAME_MAX`: a cache holds at most ``_TEXT_CACHE_MAX`` texts of at most this
many bytes and names of at most 1 KiB (about 1.5 MiB), whatever the input."""


def _remember(cache: dict[tuple[str, str], Signature], key: tuple[str, str], sig: Signature) -> None:
    """Keep ``sig`` for the (tool, argument text) ``key`` unless that would take too many bytes: a
    tool name above :data:`_CACHED_NAME_MAX`, or text of wide characters above a quarter of
    :data:`_CACHED_TEXT_MAX` (the caller has checked the text's length in characters)."""
    tool, text = key
    if len(tool) <= _CACHED_NAME_MAX and (text.isascii() or 4 * len(text) <= _CACHED_TEXT_MAX):
        if len(cache) >= _TEXT_CACHE_MAX:
            cache.clear()  # a pure cache: bounded, and correct when emptied
        cache[key] = sig


_JSON_SEEDS: Final[dict[str, int]] = {}
_TEXT_SEEDS: Final[dict[str, int]] = {}
_RAW_SEEDS: Final[dict[str, int]] = {}
_ABSENT_SEEDS: Final[dict[str, int]] = {}
_TOOL_KEYS: Final[dict[str, int]] = {}
_RESULT_SEED: Final = _xxh3_64(b"\x00result\x00")


def _seed(tool: str, kind: ArgsKind) -> int:
    """The hash seed of ``(tool, kind)``: 64 bits of XXH3 over ``tool NUL kind NUL``.

    Seeding the payload's hash with it keeps the domain separation of hashing
    ``tool NUL kind NUL payload`` without copying the payload behind a prefix.
    """
    # Chosen by identity: hashing an Enum member runs Python code.
    if kind is _JSON:
        seeds = _JSON_SEEDS
    elif kind is _TEXT:
        seeds = _TEXT_SEEDS
    elif kind is _RAW:
        seeds = _RAW_SEEDS
    else:
        seeds = _ABSENT_SEEDS
    seed = seeds.get(tool)
    if seed is None:
        seed = _xxh3_64(tool.encode("utf-8", "surrogatepass") + b"\x00" + kind.value.encode() + b"\x00")
        if len(tool) <= _CACHED_NAME_MAX:
            if len(seeds) >= _SEEDS_MAX:
                seeds.clear()  # a pure cache: bounded, and correct when emptied
            seeds[tool] = seed
    return seed




_DECODE_ERRORS: Final = (msgspec.DecodeError, RecursionError, ValueError)
"""What :meth:`Normalizer.signature` catches from the JSON decoder (the text is then TEXT)."""

_canonical: Final = getattr(speedups(), "canonical", None)
"""The compiled twin of ``_encode(normalizer._normalize(obj))`` (``None`` without the
accelerator): ``(obj, volatile_keys) -> bytes``, or ``None`` for the values it leaves to the
Python path (see ``_speedups.c``)."""

_canonical_json: Final = getattr(speedups(), "canonical_text", None)
"""The compiled ``_canonical(_decode_plain(text), volatile_keys)`` for ASCII JSON text (``None``
without the accelerator): ``(text, volatile_keys) -> bytes``, read from the text with no Python
object per value, or ``None`` for any text it leaves to the decoder (see ``_speedups.c``)."""

MIN_KEY_BYTES: Final = 16
"""The shortest secret :class:`Normalizer` accepts as ``key``."""


def _keyed_hash(key: bytes) -> Any:
    """``(payload, seed) -> int``: a 128-bit keyed BLAKE2b of ``seed`` and ``payload``."""
    blake2b = hashlib.blake2b
    from_bytes = int.from_bytes

    def hash128(payload: bytes, seed: int) -> int:
        h = blake2b(seed.to_bytes(8, "little"), key=key, digest_size=16)
        h.update(payload)
        return from_bytes(h.digest(), "big")

    return hash128


@dataclass(frozen=True, slots=True)
class Normalizer:
    """Turns (tool, arguments) into a :class:`Signature`. Immutable and stateless.

    Make variants with :meth:`with_volatile_keys`; every field is part of :attr:`version`.
    """

    volatile_keys: frozenset[str] = DEFAULT_VOLATILE_KEYS
    """Keys dropped at every depth of the arguments."""
    max_bytes: int = MAX_CANONICAL_BYTES
    """Arguments above this many bytes are hashed as raw bytes (``ArgsKind.RAW``)."""
    key: bytes | None = field(default=None, repr=False)
    """A secret (at least 16 bytes) that keys every digest: keyed BLAKE2b instead of XXH3.
    ``None`` (default): digests are unkeyed, so anyone can recompute the digest of a guessed
    value (a 6-digit PIN is found in seconds). Use the same key in every process of a fleet,
    or their signatures will not match. Never shown in ``repr`` or :attr:`version`."""
    version: str = field(init=False, compare=False)
    """Names the scheme, the volatile keys, the cap, and whether digests are keyed (with a
    fingerprint of the key, never the key): record it with every verdict."""
    _hash128: Any = field(init=False, compare=False, repr=False)
    """``(payload, seed) -> int``: XXH3-128, or keyed BLAKE2b when :attr:`key` is set."""
    _needles: tuple[str, ...] = field(init=False, compare=False, repr=False)
    _needle_re: re.Pattern[str] = field(init=False, compare=False, repr=False)
    _needle_re_b: re.Pattern[bytes] = field(init=False, compare=False, repr=False)
    _escapes: tuple[str, ...] = field(init=False, compare=False, repr=False)
    _escapes_b: tuple[bytes, ...] = field(init=False, compare=False, repr=False)
    _volatile_order: tuple[str, ...] = field(init=False, compare=False, repr=False)
    """:attr:`volatile_keys` as a tuple, for :data:`_canonical_json` (which reads a tuple's
    items without iterating a set on every call)."""
    _text_signatures: dict[tuple[str, str], Signature] = field(init=False, compare=False, repr=False)
    """The signatures of recent argument texts, by (tool, text): an agent that repeats a call
    sends the same text again (see :data:`_TEXT_CACHE_MAX`)."""
    _result_digests: dict[str, str] = field(init=False, compare=False, repr=False)
    """The digests of recent short result texts that the compiled path leaves to Python (at
    most :data:`_TEXT_CACHE_MAX` texts of at most :data:`_EMPTY_MAX` characters)."""

    def __post_init__(self) -> None:
        if not isinstance(self.volatile_keys, frozenset):
            if isinstance(self.volatile_keys, (str, bytes)) or not isinstance(self.volatile_keys, Iterable):
                raise ConfigError("volatile_keys", self.volatile_keys, "a set of non-empty strings")
            object.__setattr__(self, "volatile_keys", frozenset(self.volatile_keys))
        if not all(isinstance(k, str) and k for k in self.volatile_keys):
            raise ConfigError("volatile_keys", sorted(map(repr, self.volatile_keys)), "non-empty strings")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or not 64 <= self.max_bytes <= 1 << 30:
            raise ConfigError("max_bytes", self.max_bytes, "an integer from 64 to 2**30")
        key = self.key
        if key is not None:
            if isinstance(key, (bytearray, memoryview)):
                key = bytes(key)
                object.__setattr__(self, "key", key)
            if not isinstance(key, bytes) or not MIN_KEY_BYTES <= len(key) <= 64:
                # Never echo a secret: name its type and length only.
                shown = f"<{type(key).__name__} of {len(key)} bytes>" if isinstance(key, bytes) else f"<{type(key).__name__}>"
                raise ConfigError("key", shown, f"bytes, {MIN_KEY_BYTES} to 64 of them, or None")
        keys_digest = hashlib.sha256("\x00".join(sorted(self.volatile_keys)).encode()).hexdigest()[:8]
        version = f"{NORMALIZER_SCHEME}+vk.{keys_digest}+cap.{self.max_bytes}"
        if key is None:
            object.__setattr__(self, "_hash128", _xxh3_128)
        else:
            fingerprint = hashlib.blake2b(b"tripwire key fingerprint", key=key, digest_size=4).hexdigest()
            version += f"+keyed.{fingerprint}"
            object.__setattr__(self, "_hash128", _keyed_hash(key))
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
        object.__setattr__(self, "_escapes", tuple(escapes))
        object.__setattr__(self, "_escapes_b", tuple(e.encode() for e in escapes))
        object.__setattr__(self, "_volatile_order", tuple(sorted(self.volatile_keys)))
        object.__setattr__(self, "_text_signatures", {})
        object.__setattr__(self, "_result_digests", {})

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields: the derived ones (the keyed hash is a closure) are not pickled.
        return (Normalizer, (self.volatile_keys, self.max_bytes, self.key))

    def _may_hold_volatile(self, raw: str | bytes) -> bool:
        """True when the JSON text ``raw`` may hold a volatile key (so it must be walked)."""
        if isinstance(raw, str):
            if self._needle_re.search(raw) is not None:
                return True
            return "\\" in raw and any(e in raw for e in self._escapes)
        if self._needle_re_b.search(raw) is not None:
            return True
        return 92 in raw and any(e in raw for e in self._escapes_b)  # 92 is a backslash

    def _holds_no_volatile(self, obj: Any, raw: str | bytes) -> bool:
        """True when ``obj``, decoded from the JSON text ``raw``, has no volatile key anywhere.

        ``raw`` is bytes, or a str whose length is its size in bytes (ASCII).

        A false ``False`` only costs a walk; a false ``True`` would be a bug. Below
        :data:`_SCAN_BELOW` bytes the scan of the text (:meth:`_may_hold_volatile`) is cheapest.
        Above, this reads decoded keys (so escapes such as ``"\\u006eonce"`` need no special
        case) with C-level set tests, at a cost that grows with the number of objects, not bytes:

        1. every dict reachable through dicts alone is tested with ``isdisjoint``; lists are
           set aside. No list: done.
        2. every object in the text opens with a ``{`` (more may sit inside strings): if the
           text holds no more ``{`` than the objects already tested, no object hides in the
           lists, and their (often long) items are never touched.
        3. otherwise the objects inside the lists are found and tested too (see
           :meth:`_lists_hold_no_volatile`). All along, the items visited are counted against a
           budget of one per 32 bytes of text (about what the scan of the same text would
           cost); past it, the scan decides, so the cost stays bounded on hostile input.
        """
        size = len(raw)
        if _volatile_free is not None:  # the same walk, compiled, beats the scan at any size
            answer = _volatile_free(obj, self.volatile_keys, 16 + (size >> 4))
            return not self._may_hold_volatile(raw) if answer is None else answer
        if size < _SCAN_BELOW:
            return not self._may_hold_volatile(raw)
        isdisjoint = self.volatile_keys.isdisjoint
        budget = 16 + (size >> 5)
        lists: list[Any] | None = None
        seen = 0
        if type(obj) is dict:
            dicts = [obj]
            while dicts:
                d = dicts.pop()
                budget -= len(d)
                if budget < 0:
                    return not self._may_hold_volatile(raw)
                if not isdisjoint(d):
                    return False
                seen += 1
                for item in d.values():
                    t = type(item)
                    if t is dict:
                        dicts.append(item)
                    elif t is list:
                        if lists is None:
                            lists = [item]
                        else:
                            lists.append(item)
            if lists is None:
                return True
        if _braces_at_most(raw, seen):
            return True
        return self._lists_hold_no_volatile([obj] if lists is None else lists, raw, seen, budget)

    def _lists_hold_no_volatile(self, lists: list[Any], raw: str | bytes, seen: int, budget: int) -> bool:
        """Step 3 of :meth:`_holds_no_volatile`: walk ``lists`` and the objects they hold.

        The objects a list holds are tested in one batch before their values are read; when
        they are many for the text's size (a list of small records), the text's ``{`` are
        counted (cheaper than reading all those values), and the walk stops once it has tested
        that many objects.
        """
        isdisjoint = self.volatile_keys.isdisjoint
        braces = -1
        dicts: list[Any] = []
        while lists:
            lst = lists.pop()
            budget -= len(lst)
            if budget < 0:
                return not self._may_hold_volatile(raw)
            for item in lst:
                t = type(item)
                if t is dict:
                    dicts.append(item)
                elif t is list:
                    lists.append(item)
            if not dicts:
                continue
            if not all(map(isdisjoint, dicts)):
                return False
            seen += len(dicts)
            if braces < 0 and len(raw) < 256 * len(dicts):
                # count() reads every byte (~0.3 ns each), reading an object's values costs
                # ~100 ns: for small records, counting is cheaper.
                braces = raw.count("{") if isinstance(raw, str) else raw.count(123)
            if 0 <= braces <= seen:
                return True
            while dicts:
                d = dicts.pop()
                budget -= len(d)
                if budget < 0:
                    return not self._may_hold_volatile(raw)
                for item in d.values():
                    t = type(item)
                    if t is dict:
                        if not isdisjoint(item):
                            return False
                        seen += 1
                        dicts.append(item)
                    elif t is list:
                        lists.append(item)
        return True

    def with_volatile_keys(
        self, add: Iterable[str] = (), remove: Iterable[str] = ()
    ) -> Normalizer:
        """A normalizer with volatile keys added and/or removed."""
        keys = (self.volatile_keys | frozenset(add)) - frozenset(remove)
        return Normalizer(volatile_keys=keys, max_bytes=self.max_bytes, key=self.key)

    # -- signatures -------------------------------------------------------------------------

    def signature(self, tool: str, arguments: Any = ABSENT) -> Signature:
        """The signature of ``tool`` called with ``arguments``.

        Args:
            tool: the tool's name.
            arguments: a mapping, a JSON string (or bytes), any other text, or :data:`ABSENT`
                when the emitter recorded none. Other values are canonicalized like JSON
                values (lists, numbers, ``None``…).

        Raises:
            ConfigError: ``tool`` is not a string. Never raises for any argument value:
                hostile input gets a defined signature.
        """
        if type(tool) is not str and not isinstance(tool, str):
            raise ConfigError("tool", tool, "the tool's name, a str")
        t = type(arguments)
        if t is dict and _canonical is not None:
            # The common case from agent loops and frameworks: one compiled pass.
            payload = _canonical(arguments, self.volatile_keys)
            if payload is not None:
                seed = _JSON_SEEDS.get(tool)  # _seed(tool, _JSON), inlined
                if seed is None:
                    seed = _seed(tool, _JSON)
                return Signature(tool, self._hash128(payload, seed), _JSON)
        elif t is str:
            # A JSON string, as traces and LLMs give arguments. A repeated call (what a loop
            # is made of) sends the same text again: its signature is remembered.
            if type(tool) is str and len(arguments) <= _CACHED_TEXT_MAX:
                cache = self._text_signatures
                text_key = (tool, arguments)
                cached = cache.get(text_key)
                if cached is not None:
                    return cached
                # _text_signature(), its compiled pass inlined: a text that changes on every
                # call (a fresh request id) takes it.
                payload = (
                    _canonical_json(arguments, self._volatile_order)
                    if _canonical_json is not None and len(arguments) <= self.max_bytes
                    else None
                )
                if payload is None:
                    cached = self._decoded_text_signature(tool, arguments)
                else:
                    seed = _JSON_SEEDS.get(tool)  # _seed(tool, _JSON), inlined
                    if seed is None:
                        seed = _seed(tool, _JSON)
                    cached = Signature(tool, self._hash128(payload, seed), _JSON)
                _remember(cache, text_key, cached)
                return cached
            return self._text_signature(tool, arguments)
        return self._signature(tool, *self.canonical(arguments))

    def _text_signature(self, tool: str, arguments: str) -> Signature:
        """The signature of ``tool`` called with the argument text ``arguments`` (uncached)."""
        if _canonical_json is not None and len(arguments) <= self.max_bytes:
            # ASCII JSON text to its canonical bytes in one compiled pass: no decoded value.
            # (Its bytes are those of _canonical below; None sends the text down that path.)
            payload = _canonical_json(arguments, self._volatile_order)
            if payload is not None:
                return Signature(tool, self._hash128(payload, _seed(tool, _JSON)), _JSON)
        return self._decoded_text_signature(tool, arguments)

    def _decoded_text_signature(self, tool: str, arguments: str) -> Signature:
        """:meth:`_text_signature` for text the compiled pass leaves to the JSON decoder."""
        # The steps of _canonical_text, minus a few calls and, for ASCII text (whose length is
        # its size in bytes), minus the copy to bytes: msgspec reads the str in place.
        if (
            arguments.isascii()
            and len(arguments) <= self.max_bytes
            and arguments
            and arguments[0] in _JSON_FIRST_CHARS
        ):
            if _canonical is not None:
                # Decoded without the float hook, then canonicalized in C (see _decode_plain);
                # anything the compiled pass leaves to Python is decoded again with the hook.
                try:
                    plain = _decode_plain(arguments)
                except _DECODE_ERRORS:
                    pass
                else:
                    tp = type(plain)
                    if tp is dict or tp is list:
                        payload = _canonical(plain, self.volatile_keys)
                        if payload is not None:
                            return Signature(tool, self._hash128(payload, _seed(tool, _JSON)), _JSON)
            try:
                obj = _decode_json(arguments)
            except _DECODE_ERRORS:
                return self._signature(tool, _TEXT, arguments.encode())
            return self._decoded_signature(tool, obj, arguments)
        return self._signature(tool, *self._canonical_text(arguments))

    def _decoded_signature(self, tool: str, obj: Any, text: str) -> Signature:
        """The signature of JSON ``text`` (ASCII, at most the cap) that decoded to ``obj``."""
        t = type(obj)
        if t is dict or t is list:
            if _canonical is not None:
                payload = _canonical(obj, self.volatile_keys)
                if payload is not None:
                    return Signature(tool, self._hash128(payload, _seed(tool, _JSON)), _JSON)
            if _may_nest_deeper(text):
                obj = self._strip(obj)  # cut at MAX_DEPTH, as the same value given as a dict is
            elif len(text) < _SCAN_BELOW and _volatile_free is None:
                # _holds_no_volatile() for short text, inlined: the regex scan.
                if self._needle_re.search(text) is not None or (
                    "\\" in text and any(e in text for e in self._escapes)
                ):
                    obj = self._strip(obj)
            elif not self._holds_no_volatile(obj, text):
                obj = self._strip(obj)
        try:
            payload = _encode_msgpack(obj)
        except Exception:  # the rare values MessagePack cannot hold
            return self._signature(tool, *self._canonical_decoded(obj, text.encode()))
        return Signature(tool, self._hash128(payload, _seed(tool, _JSON)), _JSON)

    def _signature(self, tool: str, kind: ArgsKind, payload: bytes) -> Signature:
        return Signature(tool, self._hash128(payload, _seed(tool, kind)), kind)

    def tool_signature(self, tool: str) -> Signature:
        """The name-only signature of ``tool`` (what the ``tool`` key mode compares).

        Raises:
            ConfigError: ``tool`` is not a string.
        """
        if self.key is not None:
            return self._signature(tool, _ABSENT_KIND, b"")
        key = _TOOL_KEYS.get(tool)
        if key is None:
            if not isinstance(tool, str):
                raise ConfigError("tool", tool, "the tool's name, a str")
            key = _xxh3_128(b"", _seed(tool, _ABSENT_KIND))
            if len(tool) <= _CACHED_NAME_MAX:
                if len(_TOOL_KEYS) >= _SEEDS_MAX:
                    _TOOL_KEYS.clear()  # a pure cache: bounded, and correct when emptied
                _TOOL_KEYS[tool] = key
        return Signature(tool, key, _ABSENT_KIND)

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
        return f"{self._hash128(payload, _seed('', kind)):032x}"

    def result_digest(self, value: Any) -> str:
        """The digest of a tool *result*, as progress evidence.

        Short results keep their small numbers: a page number, a count, a progress figure or a
        log's ``line 3`` is what tells one status from the next, and masking every digit made
        healthy paging, batch and polling work look like a loop. What changes on every call
        without being evidence is masked instead (:data:`VOLATILE_TEXT`,
        :data:`VOLATILE_WORDS`): timestamps, dates and clock times, durations (``0.53s``,
        ``1m23s``), UUIDs and hex ids whatever they start with, memory addresses, numbers of 4
        digits or more (a fresh order id, an epoch time), a shell's command counter, random
        letter-and-digit tokens, request ids written out and temporary file names. Results
        longer than :data:`_SHORT` bytes
        (a file view, a build log) lose every digit: there a number that changed while the
        text did not (the line count of a file the same edit keeps growing) is no news.
        Mappings are canonicalized like arguments (volatile keys dropped, sorted JSON); text
        is parsed only when it is JSON carrying a volatile key (results of one tool come from
        one piece of code, so their key order is stable).

        A result that found nothing (no output, ``None``, ``[]``, ``{}``, ``null``, a short
        "No matches found" / "0 results" / "not found" message) digests to
        :data:`EMPTY_RESULT` whatever its wording: eight different searches that all found
        nothing got one result, and the same-result rule counts exactly these.

        32 hex characters of XXH3-128, seeded apart from argument digests.
        """
        if type(value) is str and _prepare is not None:
            prepared = _prepare(value, self.max_bytes)
            if prepared is not None:
                return self._result_hash(prepared)
            if len(value) <= _EMPTY_MAX:
                # A short text the compiled path left here ("No results.", a small JSON
                # document): what a loop gets again and again. Its digest is remembered.
                cache = self._result_digests
                digest = cache.get(value)
                if digest is None:
                    digest = self._result_digest(value)
                    if len(cache) >= _TEXT_CACHE_MAX:
                        cache.clear()  # a pure cache: bounded, and correct when emptied
                    cache[value] = digest
                return digest
        return self._result_digest(value)

    def _result_digest(self, value: Any) -> str:
        """:meth:`result_digest` by its Python path, uncached."""
        if value is ABSENT or value is None:
            return EMPTY_RESULT
        if isinstance(value, (str, bytes, bytearray, memoryview)):
            raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
            payload = raw
            # Only an object, an array or a string can hold a volatile key: text that starts
            # with anything else is never parsed (nor is text above the cap), so skip the scan.
            # (A number, true, false or null holds no quote and no backslash, so the scan could
            # not find a key in it anyway; lstrip() strips a superset of JSON's whitespace.)
            opener = raw[:1]
            if opener.isspace():
                opener = raw.lstrip()[:1]
            if opener in _OPENERS and len(raw) <= self.max_bytes and self._may_hold_volatile(raw):
                obj = self._parse(raw)
                if obj is not _NOT_JSON:
                    payload = _json_bytes(self._strip(obj))
        else:
            payload = _json_bytes(self._normalize(value))
        size = len(payload)
        if size > _SHORT:
            if _strip_digits is None:
                return self._result_hash(payload.translate(None, _DIGITS))
            return self._result_hash(_strip_digits(payload))
        if size <= _EMPTY_MAX:
            bare = payload.strip()
            # A cheap test first: only these can be "found nothing" messages. Past the short
            # values and the starts, the pattern can only match text that starts with "0" or
            # ends with "found", "found." or "found!" ("… not found"), and this test has always
            # asked for a lower-case "ound" there: "Found 3 results" never reaches the regex.
            maybe = (
                len(bare) <= 4
                or bare[:2].lower() in _EMPTY_STARTS
                or (
                    (bare[:1] == b"0" or bare[-6:].lower().rstrip(b".!").endswith(b"found"))
                    and b"ound" in bare
                )
            )
            if maybe and _EMPTY_RE.match(bare) is not None:
                return EMPTY_RESULT
        masked = None if _mask is None else _mask(payload)
        return self._result_hash(_mask_volatile(payload) if masked is None else masked)

    def _result_hash(self, payload: bytes) -> str:
        if self.key is not None:  # keyed: a digest of a guessable result must not reveal it
            return f"{self._hash128(payload, _RESULT_SEED):032x}"
        return _xxh3_128_hex(payload, _RESULT_SEED)

    def _parse(self, raw: bytes) -> Any:
        """The decoded JSON document ``raw`` (at most the cap), or ``_NOT_JSON``."""
        if not raw or raw[0] not in _JSON_FIRST:
            # Not JSON (most free text starts with a letter other than t/f/n): skip the parser.
            return _NOT_JSON
        try:
            return _decode_json(raw)
        except (msgspec.DecodeError, RecursionError, ValueError):
            return _NOT_JSON

    def _canonical_text(self, text: str | bytes | bytearray | memoryview) -> tuple[ArgsKind, bytes]:
        raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)
        if len(raw) > self.max_bytes:
            return _RAW, raw
        if not raw or raw[0] not in _JSON_FIRST:
            # Not JSON (most free text starts with a letter other than t/f/n): skip the parser.
            return _TEXT, raw
        if _canonical_json is not None:
            payload = _canonical_json(raw, self._volatile_order)
            if payload is not None:  # the bytes of the steps below, without decoding
                return _JSON, payload
        try:
            obj = _decode_json(raw)
        except (msgspec.DecodeError, RecursionError, ValueError):
            return _TEXT, raw
        t = type(obj)
        if (t is dict or t is list) and (_may_nest_deeper(raw) or not self._holds_no_volatile(obj, raw)):
            obj = self._strip(obj)
        return self._canonical_decoded(obj, raw)

    @staticmethod
    def _canonical_decoded(obj: Any, raw: bytes) -> tuple[ArgsKind, bytes]:
        """Kind and canonical bytes of ``obj``, decoded (and normalized) from the JSON ``raw``."""
        try:
            return _JSON, _encode_msgpack(obj)
        except RecursionError:
            # Valid JSON nested deeper than the encoder goes: fall back to the text itself.
            return _TEXT, raw
        except Exception:  # an integer wider than 64 bits
            payload = _encode_fallback(obj)
            return (_TEXT, raw) if payload is None else (_JSON, payload)

    def _canonical_object(self, value: Any) -> tuple[ArgsKind, bytes]:
        # Already canonical (the walk is done), so the cap does not apply: a mapping above it
        # keeps kind JSON, while the same arguments as a JSON string above the cap are RAW.
        return _JSON, _encode(self._normalize(value))

    def _strip(self, obj: Any) -> Any:
        """:meth:`_normalize` for a value fresh from the JSON decoder, done in place.

        Such a value holds only dicts with ``str`` keys, lists, strings, integers, the floats
        and tokens of :func:`_float_hook`, booleans and ``None``, and never a cycle: what is
        left to do is to drop the volatile keys and cut the nesting at :data:`MAX_DEPTH`. No
        copy, no recursion, and lists without containers are passed over at C speed.
        """
        containers = _CONTAINERS
        if type(obj) not in containers:
            return obj
        volatile = self.volatile_keys
        isdisjoint = volatile.isdisjoint
        stack: list[tuple[Any, int]] = [(obj, 1)]  # a container, and the depth of its items
        while stack:
            v, depth = stack.pop()
            if type(v) is dict:
                if not isdisjoint(v):
                    for k in volatile.intersection(v):
                        del v[k]
                for k, item in v.items():
                    t = type(item)
                    if t is dict or t is list:
                        if depth >= MAX_DEPTH:
                            v[k] = _DEPTH  # same size: fine while iterating
                        else:
                            stack.append((item, depth + 1))
            elif not containers.isdisjoint(map(type, v)):
                if depth >= MAX_DEPTH:
                    v[:] = [_DEPTH if type(item) in containers else item for item in v]
                else:
                    for item in v:
                        t = type(item)
                        if t is dict or t is list:
                            stack.append((item, depth + 1))
        return obj

    def _normalize(self, value: Any) -> Any:
        """A JSON-ready copy of ``value``: volatile keys dropped, numbers and oddities fixed."""
        volatile = self.volatile_keys
        active: set[int] = set()

        def walk(v: Any, depth: int) -> Any:
            t = type(v)
            # Exact JSON types first (the common case), then the general rules.
            if t is str or t is int or t is bool or v is None:
                return v
            if t is float:
                if v - v == 0.0:
                    return int(v) if v.is_integer() else v
                return _float_token(v)
            # Subclasses sign as the value they hold, as their JSON text does: a str subclass
            # (a str enum's member included) as its text, a float subclass (numpy.float64) as
            # its number. str.__str__ and float.__float__ skip any overridden conversion.
            if isinstance(v, str):
                return str.__str__(v)
            if isinstance(v, int):
                return int(v)
            if isinstance(v, float):
                f = float.__float__(v)
                if f - f == 0.0:
                    return int(f) if f.is_integer() else f
                return _float_token(f)
            if depth >= MAX_DEPTH:
                return _DEPTH
            if t is dict or isinstance(v, Mapping):
                vid = id(v)
                if vid in active:
                    return _CYCLE
                active.add(vid)
                try:
                    out: dict[str, Any] = {}
                    for k, item in v.items():
                        sk = k if type(k) is str else str.__str__(k) if isinstance(k, str) else _key_text(k)
                        if sk in volatile:
                            continue
                        ti = type(item)
                        out[sk] = item if ti is str or ti is int or ti is bool or item is None else walk(item, depth + 1)
                    return out
                except Exception:  # a mapping whose items() or iteration raises: never here
                    return _unreadable(v)
                finally:
                    active.discard(vid)
            if t is list or isinstance(v, (list, tuple)):
                vid = id(v)
                if vid in active:
                    return _CYCLE
                active.add(vid)
                try:
                    items: list[Any] = []
                    append = items.append
                    for item in v:
                        ti = type(item)
                        append(item if ti is str or ti is int or ti is bool or item is None else walk(item, depth + 1))
                    return items
                except Exception:  # a list subclass whose iteration raises
                    return _unreadable(v)
                finally:
                    active.discard(vid)
            if isinstance(v, (set, frozenset)):
                try:
                    members = [walk(item, depth + 1) for item in v]
                except Exception:
                    return _unreadable(v)
                return sorted(members, key=_encode)
            if isinstance(v, (bytes, bytearray, memoryview)):
                return "\x00bytes:" + _xxh3_128_hex(bytes(v))
            return _object_token(v)

        return walk(value, 0)


def _may_nest_deeper(raw: str | bytes) -> bool:
    """False when the JSON text ``raw`` surely holds no container deeper than :data:`MAX_DEPTH`
    (each level opens with a ``{`` or a ``[``, and closes too): then cutting it there changes
    nothing, and the walk that cuts can be skipped."""
    if len(raw) <= 2 * MAX_DEPTH:
        return False
    if isinstance(raw, str):
        return raw.count("{") + raw.count("[") > MAX_DEPTH
    return raw.count(b"{") + raw.count(b"[") > MAX_DEPTH


def _braces_at_most(raw: str | bytes, n: int) -> bool:
    """True when the text ``raw`` holds at most ``n`` ``{`` characters."""
    if n > 3:
        # count() reads every byte in a plain loop, but builds nothing.
        return (raw.count("{") if isinstance(raw, str) else raw.count(123)) <= n
    # split() finds a few at memchr speed, in one C call (a find() loop costs more).
    if isinstance(raw, str):
        rest = raw.split("{", n)
        return len(rest) <= n or "{" not in rest[-1]
    rest_b = raw.split(b"{", n)
    return len(rest_b) <= n or 123 not in rest_b[-1]  # 123 is "{"


_CONTAINERS: Final = frozenset((dict, list))


class _NotJson:
    """Marker: the text is not a JSON document."""


_NOT_JSON: Final = _NotJson()


def _key_text(key: Any) -> str:
    if isinstance(key, float):
        key = _float_token(key)
    try:
        return str(key)
    except Exception:
        # An integer too long for decimal text, or a key whose __str__ raises: the signature
        # must not raise (issue 16).
        if isinstance(key, int):
            return f"\x00int:{key:x}"
        return f"\x00{type(key).__qualname__}:<unprintable>"


def _unreadable(value: Any) -> str:
    """The token of a container that raised while it was read (its ``items()`` or its
    iteration): its type, as the signature of a call must never raise."""
    try:
        return "\x00unreadable:" + str(type(value).__qualname__)
    except Exception:  # a metaclass's hostile __qualname__
        return "\x00unreadable"


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
    if normalizer is None:
        return DEFAULT_NORMALIZER.signature(tool, arguments)
    if not isinstance(normalizer, Normalizer):
        raise ConfigError("normalizer", normalizer, "a tripwire Normalizer, or None")
    return normalizer.signature(tool, arguments)
