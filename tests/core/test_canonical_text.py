"""``canonical_text`` (``tripwire/core/_speedups.c``): ASCII JSON argument text straight to its
canonical bytes. It must write exactly ``canonical(msgspec.json.decode(text), keys)`` or
decline (``None``); for ordinary text it must answer, or the signature's fast path is never
taken. (The whole suite also runs with ``TRIPWIRE_NO_EXTENSIONS=1``, without it.)

Under ``CI=true`` the accelerator must be built (the clean-clone install compiles it); locally
these tests skip, loudly, when it was not.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiled_only import speedups_or_skip
from tripwire.core import signature as signature_module
from tripwire.core.reasons import ArgsKind
from tripwire.core.signature import DEFAULT_NORMALIZER, MAX_DEPTH, Normalizer

_speedups = speedups_or_skip()

KEYS = frozenset({"nonce", "request_id", "now", "n\u00e9", "\U0001f600", "a/b"})
ORDER = tuple(sorted(KEYS))


def reference(text: str | bytes, keys: Any = KEYS) -> bytes | None:
    """What the leaf stands in for: msgspec's decode, then the compiled walk (tested against
    its Python twin in test_speedups.py); None where the decoder refuses the text or the
    value is not a container."""
    try:
        value = signature_module._decode_plain(text)
    except (signature_module.msgspec.DecodeError, RecursionError, ValueError):
        return None
    if type(value) not in (dict, list):
        return None
    return _speedups.canonical(value, frozenset(keys))


def leaf(text: str | bytes, keys: Any = KEYS) -> bytes | None:
    got = _speedups.canonical_text(text, keys)
    # The keys as a tuple (what the normalizer passes) and the text as bytes say the same.
    assert _speedups.canonical_text(text, tuple(keys)) == got
    if isinstance(text, str) and text.isascii():
        assert _speedups.canonical_text(text.encode(), keys) == got
    return got


def agrees(text: str | bytes, keys: Any = KEYS) -> bytes | None:
    """The leaf's answer, after checking that it is the reference's or None."""
    got = leaf(text, keys)
    if got is not None:
        assert got == reference(text, keys), text
    return got


# -- generated values, serialized in several styles ----------------------------------------------

json_keys = st.sampled_from(
    ["a", "b", "ab", "a\x00", "", "nonce", "request_id", "now", "nonce2", "n\u00e9", "\U0001f600", "a/b", "z" * 40, "\u00e9t\u00e9"]
) | st.text(max_size=5)
wide_ints = st.sampled_from(
    [0, 1, -1, 31, 32, -32, -33, 127, 128, 255, 256, 65535, 65536, 2**31, -(2**31) - 1, 2**32, 2**53, 2**53 + 1,
     2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**20, -(10**20)]
)
json_floats = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [-0.0, 0.0, 1.0, -1.0, 1e308, -1e308, 5e-324, 2.2250738585072014e-308, 0.1, 0.5, 1e22, 1e23, 2.0**53, 2.0**63, 2.0**64,
     -(2.0**63), 123456.789, 1.7976931348623157e308, 9007199254740993.0, 1e-7, 3.0e10]
)
json_text = st.text(max_size=12) | st.text(st.characters(blacklist_categories=()), max_size=6) | st.sampled_from(
    ["\ud800", "\udc00x", "\ud83d\ude00", "\U0001f600", "\x00", "\x1f", "\\", '"', "/", "\b\f\n\r\t", "\u2028", "x" * 40]
)
json_scalars = st.none() | st.booleans() | st.integers() | wide_ints | json_floats | json_text
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=18) | st.dictionaries(json_keys, children, max_size=18),
    max_leaves=40,
)
containers = st.lists(json_values, max_size=5) | st.dictionaries(json_keys, json_values, max_size=8)
styles = st.sampled_from(
    [
        {},
        {"separators": (",", ":")},
        {"indent": 2},
        {"indent": "\t", "separators": (" ,", " : ")},
        {"sort_keys": True},
        {"ensure_ascii": False},
    ]
)


def ordinary(value: Any) -> bool:
    """Nothing the leaf may decline: numbers within 64 bits (integral floats too), no lone
    surrogate, shallow nesting."""
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, float):
        return not value.is_integer() or -(2.0**63) <= value < 2.0**64
    if isinstance(value, str):
        return not any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    if isinstance(value, list):
        return all(map(ordinary, value))
    return all(ordinary(k) and ordinary(v) for k, v in value.items())


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=containers, style=styles)
def test_the_leaf_writes_the_reference_bytes_and_answers_ordinary_text(value: Any, style: dict[str, Any]) -> None:
    text = json.dumps(value, **style)
    got = agrees(text)
    if text.isascii() and ordinary(value):
        assert got is not None, text  # the fast path is taken


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=containers)
def test_the_signature_of_the_text_is_the_signature_of_the_value(value: Any) -> None:
    text = json.dumps(value)
    if not ordinary(value):
        return
    normalizer = Normalizer(volatile_keys=KEYS)
    assert normalizer.signature("search_docs", text) == normalizer.signature("search_docs", value)
    assert normalizer.canonical(text) == (ArgsKind.JSON, leaf(text, ORDER))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=containers, style=styles)
def test_signatures_are_those_of_the_python_path(value: Any, style: dict[str, Any]) -> None:
    text = json.dumps(value, **style)
    compiled = Normalizer(volatile_keys=KEYS).signature("t", text)
    saved = signature_module._canonical, signature_module._canonical_json
    signature_module._canonical = signature_module._canonical_json = None  # type: ignore[misc]
    try:
        python = Normalizer(volatile_keys=KEYS).signature("t", text)
        python_bytes = Normalizer(volatile_keys=KEYS).canonical(text.encode("utf-8", "surrogatepass"))
    finally:
        signature_module._canonical, signature_module._canonical_json = saved  # type: ignore[misc]
    assert compiled == python, text
    assert Normalizer(volatile_keys=KEYS).canonical(text.encode("utf-8", "surrogatepass")) == python_bytes


# -- numbers --------------------------------------------------------------------------------------

number_texts = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True)


@settings(max_examples=1500, deadline=None)
@given(number=number_texts | st.floats(allow_nan=False, allow_infinity=False).map(repr))
def test_numbers_are_read_correctly_rounded(number: str) -> None:
    """Every number the decoder reads as a float or an integer within 64 bits: the same bytes
    (a float's 64 bits, or the integer of an integral one); the rest is declined."""
    got = agrees(f"[{number}]")
    value = json.loads(number)
    if ordinary(value) and not (isinstance(value, float) and value in (float("inf"), float("-inf"))):
        assert got is not None, number
    agrees(f'{{"nonce": {number}, "x": [{number}, -{number.lstrip("-")}]}}')


def test_hand_picked_numbers() -> None:
    answered = ["0", "-0", "-0.0", "0.0", "1.0", "1E2", "1e+2", "1e-2", "2.5E-3", "5e-324", "4.9e-324", "2e-324",
                "1e-400", "-1e-400", "1.5e-300", "2.2250738585072011e-308", "0.1", "9007199254740993",
                "9007199254740993.0", "18446744073709551615", "-9223372036854775808", "123456789012345678.9",
                "0.30000000000000004", "1" + "0" * 19, "1.0000000000000000000000001", "1e000005", "100e-2"]
    for number in answered:
        text = f'[{number}, {{"k": {number}}}]'
        assert agrees(text) is not None, number
    # (wider than 64 bits, out of range, invalid, or an exponent of more than 6 digits)
    declined = ["18446744073709551616", "-9223372036854775809", "1e400", "-1e400", "1e19999999",
                "123456789012345678901234567890", "1e20", "-1e19", "1e308", "1.5e300", "01", "-", "1.", ".5", "1e", "1e+", "+1",
                "0x10", "1_000", "NaN", "Infinity", "-Infinity", "1.5e0000001"]
    for number in declined:
        assert agrees(f"[{number}]") is None, number


# -- text ------------------------------------------------------------------------------------------


def test_odd_but_valid_text_is_answered() -> None:
    odd = [
        ' \t\n\r{ \t\n\r"a" \t\n\r: \t\n\r[ \t\n\r1 \t\n\r, \t\n\r2 \t\n\r] \t\n\r, "b":{} } \t\n\r',
        '["\\/ \\b \\f \\n \\r \\t \\" \\\\"]',
        '["\\u0041", "\\u00e9\\u00E9", "\\u20ac", "\\ud83d\\ude00", "\\uD83D\\uDE00", "\\u0000"]',
        '{"\\u006eonce": 1, "n\\u00e9": 2, "\\ud83d\\ude00": 3, "a\\/b": 4, "kept": 5}',  # all volatile but kept
        '{"b": 1, "a": 2, "ab": 3, "a\\u0000": 4, "": 5, "\\u00e9": 6, "z": 7}',
        '{"nonce": {"deep": [1, 2, {"x": "\\u0041"}]}, "nonce": [3], "q": 1}',  # a volatile key twice
        "[" * (MAX_DEPTH - 1) + "{}" + "]" * (MAX_DEPTH - 1),
        "[" * MAX_DEPTH + "]" * MAX_DEPTH,
        json.dumps(list(range(70000))),  # 32-bit array header
        json.dumps({f"k{i:03}": i for i in reversed(range(300))}),  # 16-bit map header, reordered
        json.dumps(["x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 65535, "x" * 65536, "\u00e9" * 40]),
        json.dumps({"k": "\x7f~ !"}),
        "[]",
        "{}",
        " [ ] ",
        "[true,false,null]",
    ]
    for text in odd:
        got = agrees(text)
        assert got is not None and got == reference(text), text[:80]


def test_what_is_not_certain_is_declined() -> None:
    declined = [
        '{"a": 1, "a": 2}',  # a key twice (the decoder keeps the last value)
        '{"a": 1, "\\u0061": 2}',  # the same key, spelled twice
        '["\\ud800"]',
        '["\\udc00"]',
        '["\\ud800\\u0041"]',
        '["\\ud800x"]',
        '{"\\udfff": 1}',
        '{"nonce": "\\ud800"}',
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "[" * MAX_DEPTH + "{}" + "]" * MAX_DEPTH,
        '"a string"',  # top-level scalars
        "1",
        "null",
        "",
        "   ",
        '["caf\u00e9"]',  # not ASCII
        '{"a": 1} x',  # trailing data
        '{"a": 1}{}',
        "[1,]",
        '{"a": 1,}',
        "[1 2]",
        '{"a" 1}',
        '{a: 1}',
        "{'a': 1}",
        '["\t"]',  # a control character in a string
        '["\x00"]',
        "[1]\x00",
        '["\\x41"]',
        '["\\u004"]',
        '["\\u00G1"]',
        '["\\U0041"]',
        '["\\a"]',
        '["abc]',
        '["abc\\"]',
        "[tru]",
        "[nul]",
        "[True]",
        "[",
        "[[]",
        '{"a": [}',
    ]
    for text in declined:
        assert agrees(text) is None, text
    assert agrees(b'["caf\xc3\xa9"]') is None  # bytes that are not ASCII
    assert agrees(b"[1]\xff") is None


def test_volatile_keys_match_exactly_after_unescaping() -> None:
    keys = frozenset({"nonce", "a\"b", "x\\y", "\u00e9"})
    text = '{"nonce": 1, "nonc": 2, "noncee": 3, "Nonce": 4, "a\\"b": 5, "x\\\\y": 6, "\\u00e9": 7, "\\u00e9\\u00e9": 8}'
    got = agrees(text, keys)
    assert got is not None
    assert got == _speedups.canonical({"nonc": 2, "noncee": 3, "Nonce": 4, "\u00e9\u00e9": 8}, frozenset())


def test_keys_the_leaf_cannot_read_send_the_text_to_the_decoder() -> None:
    class Key(str):
        pass

    assert _speedups.canonical_text('{"a": 1}', frozenset({Key("b")})) is None
    assert _speedups.canonical_text('{"a": 1}', tuple(f"k{i}" for i in range(65))) is None
    assert agrees('{"a": 1}', tuple(f"k{i}" for i in range(64))) is not None
    assert agrees('{"a": 1, "k": 2}', frozenset({"\ud800", "k"})) is not None  # a lone surrogate key: skipped
    with pytest.raises(TypeError, match="tuple, set or frozenset"):
        _speedups.canonical_text("{}", ["nonce"])
    with pytest.raises(TypeError, match="str or bytes"):
        _speedups.canonical_text(bytearray(b"{}"), KEYS)
    with pytest.raises(TypeError, match="2 arguments"):
        _speedups.canonical_text("{}")  # type: ignore[call-arg]


# -- invalid text ----------------------------------------------------------------------------------

mutation_bytes = st.sampled_from([*'{}[]",:\\ 0123456789.eE+-tfnulx\t\n\x00\x1f', "\\u", "\\ud800", "\u00e9"])


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=containers, data=st.data())
def test_mutated_text_is_declined_whenever_the_decoder_refuses_it(value: Any, data: Any) -> None:
    text = json.dumps(value, separators=data.draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        how = data.draw(st.sampled_from(["insert", "replace", "delete", "truncate", "double"]))
        piece = data.draw(mutation_bytes)
        if how == "insert":
            text = text[:at] + piece + text[at:]
        elif how == "replace":
            text = text[:at] + piece + text[at + 1 :]
        elif how == "delete":
            text = text[:at] + text[at + 1 :]
        elif how == "truncate":
            text = text[:at]
        else:
            text = text[:at] + text[at:][:3] + text[at:]
    got = agrees(text)
    if reference(text) is None:
        assert got is None, text


# -- in the normalizer -----------------------------------------------------------------------------


def test_the_normalizer_takes_the_leaf_for_ordinary_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """No JSON decoder runs for ordinary argument text: the compiled pass answers."""

    def refuse(_: Any) -> Any:
        raise AssertionError("the decoder ran")

    texts = [
        '{"query": "refund policy", "limit": 10, "filters": {"lang": "en", "score": 0.5}, "request_id": "r-1"}',
        json.dumps({"context": ["lorem ipsum " * 8] * 20, "opts": {"now": 1, "k": [1, 2.0, -3.5e-7]}}),
        "[1, 2, 3]",
    ]
    expected = [DEFAULT_NORMALIZER.signature("search_docs", json.loads(t)) for t in texts]
    monkeypatch.setattr(signature_module, "_decode_plain", refuse)
    monkeypatch.setattr(signature_module, "_decode_json", refuse)
    for text, signature in zip(texts, expected, strict=True):
        assert Normalizer().signature("search_docs", text) == signature
        assert Normalizer()._text_signature("search_docs", text) == signature
        assert Normalizer().canonical(text)[0] is ArgsKind.JSON
        assert Normalizer().canonical(text.encode())[0] is ArgsKind.JSON


def test_text_above_the_cap_stays_raw() -> None:
    text = json.dumps({"q": "x" * 100})
    small = Normalizer(max_bytes=64)
    assert small.canonical(text)[0] is ArgsKind.RAW
    assert small.signature("t", text).kind is ArgsKind.RAW
    assert small._text_signature("t", text).kind is ArgsKind.RAW
