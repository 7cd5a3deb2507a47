"""The compiled leaf helpers (``tripwire/core/_speedups.c``) against their Python twins in
``tripwire/core/signature.py``: the same bytes, the same signatures. (The whole suite also runs
with ``TRIPWIRE_NO_EXTENSIONS=1``, against the twins alone.)

Under ``CI=true`` the accelerator must be built (the clean-clone install compiles it); locally
these tests skip, loudly, when it was not.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compiled_only import speedups_or_skip
from tripwire.core import signature as signature_module
from tripwire.core import watch
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer

_speedups = speedups_or_skip()


def bytes_kept(run: Any) -> int:
    """The memory ``run(20)`` leaves allocated beyond what ``run(1)`` left (caches warmed)."""
    gc.collect()
    tracemalloc.start()
    try:
        run(1)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        run(20)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return int(after - first)


VOLATILE = frozenset({"nonce", "timestamp"})
walk_keys = st.sampled_from(["a", "b", "nonce", "timestamp", "q", "noncee"])
decoded_json = st.recursive(
    st.none() | st.integers() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(walk_keys, children, max_size=4),
    max_leaves=30,
)


def has_volatile(value: Any) -> bool:
    if isinstance(value, dict):
        return any(k in VOLATILE or has_volatile(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_volatile(v) for v in value)
    return False


@settings(max_examples=500, deadline=None)
@given(value=decoded_json, budget=st.integers(0, 40))
def test_volatile_free_agrees_with_a_recursive_oracle(value: Any, budget: int) -> None:
    answer = _speedups.volatile_free(value, VOLATILE, budget)
    assert _speedups.volatile_free(value, VOLATILE, 10**6) is (not has_volatile(value))
    assert answer is None or answer is (not has_volatile(value))  # None only when over budget


def test_volatile_free_handles_any_depth_and_says_when_over_budget() -> None:
    deep: Any = {"nonce": 1}
    for _ in range(100_000):
        deep = [deep]
    assert _speedups.volatile_free(deep, VOLATILE, 200_000) is False
    assert _speedups.volatile_free(deep, VOLATILE, 1000) is None
    with pytest.raises(TypeError, match="set or frozenset"):
        _speedups.volatile_free({}, ["nonce"], 10)


def test_signatures_are_the_same_without_the_accelerator() -> None:
    """The walk only decides whether to strip: the digests must not depend on the build."""
    import json

    samples = [
        '{"q": "refund policy", "limit": 10}',
        '{"q": "x", "nonce": "abc", "meta": {"timestamp": 5, "deep": [{"request_id": 1}]}}',
        json.dumps({"context": ["lorem ipsum " * 8] * 20, "opts": {"now": 1, "k": [1, 2.0]}}),
        json.dumps({"rows": [{"id": i, "_ts": i} for i in range(300)]}),
        '{"\\u006eonce": 1, "a": 2}',
        "[1, 2, 3]",
        "not json at all",
    ]
    code = (
        "import json, sys; from tripwire.core.signature import signature_of; "
        "print(json.dumps([signature_of('t', s).digest for s in json.load(sys.stdin)]))"
    )
    digests = []
    for flag in ("0", "1"):
        env = {**os.environ, "TRIPWIRE_NO_EXTENSIONS": flag}
        out = subprocess.run(
            [sys.executable, "-c", code], input=json.dumps(samples), env=env, capture_output=True, text=True, check=True
        )
        digests.append(json.loads(out.stdout))
    assert digests[0] == digests[1]
    assert len(set(digests[0])) == len(samples)


# -- canonical: the compiled twin of _encode(_normalize(value)) -----------------------------------

canonical_keys = st.sampled_from(["q", "page", "nonce", "request_id", "a_b", "é", "limit", "", "k" * 40])
canonical_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1, -32, -33, -128, -129, -(2**15), -(2**15) - 1, -(2**31), -(2**31) - 1, -(2**63)])
    | st.floats()
    | st.sampled_from([1e19, -9.3e18, 2.0**63, 2.0**64, -(2.0**63), -0.0, 1e300])
    | st.text(max_size=40)
    | st.sampled_from(["x" * 31, "x" * 32, "x" * 255, "x" * 256, "x" * 66_000, "\ud800", "\x00NaN"])
    | st.binary(max_size=4)
)
canonical_values = st.recursive(
    canonical_scalars,
    lambda children: st.lists(children, max_size=18)
    | st.tuples(children, children)
    | st.dictionaries(canonical_keys | st.text(max_size=4) | st.integers(0, 3), children, max_size=18),
    max_leaves=60,
)


def reference_bytes(value: Any, normalizer: Any = DEFAULT_NORMALIZER) -> bytes:
    return signature_module._encode(normalizer._normalize(value))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=canonical_values)
def test_canonical_writes_the_reference_bytes_or_declines(value: Any) -> None:
    got = _speedups.canonical(value, DEFAULT_NORMALIZER.volatile_keys)
    if got is not None:
        assert got == reference_bytes(value)


def test_canonical_answers_the_common_arguments_and_declines_the_rest() -> None:
    keys = DEFAULT_NORMALIZER.volatile_keys
    answered = [
        {"query": "refund policy", "limit": 10, "filters": {"lang": "en", "score": 0.5}},
        {"q": "x", "request_id": "r-1", "meta": {"timestamp": 5, "deep": [{"nonce": 1}]}},
        {"n": 1.0, "big": 2**64 - 1, "neg": -(2**63), "nan": float("nan"), "inf": float("-inf")},
        {"rows": [{"id": i} for i in range(300)], "t": (1, "a")},
        [1, "two", None, True, False],
        {},
    ]
    for value in answered:
        assert _speedups.canonical(value, keys) == reference_bytes(value), value
    declined: list[Any] = [
        {"big": 2**64},  # wider than 64 bits
        {"f": 1e300},  # an integral float wider than 64 bits
        {1: "non-str key"},
        {"s": "\ud800"},  # a lone surrogate
        {"b": b"bytes"},
        {"set": {1, 2}},
        {"o": object()},
        {"k": True and type("S", (str,), {})("str subclass")},
    ]
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    declined.append(deep)
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    declined.append(cycle)
    for value in declined:
        assert _speedups.canonical(value, keys) is None, value
    with pytest.raises(TypeError, match="set or frozenset"):
        _speedups.canonical({}, ["nonce"])
    with pytest.raises(TypeError, match="2 arguments"):
        _speedups.canonical({})  # type: ignore[call-arg]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=canonical_values, tool=st.sampled_from(["search_docs", "t", "é"]), as_text=st.booleans())
def test_signatures_agree_with_the_python_twin(value: Any, tool: str, as_text: bool) -> None:
    """The same signature with the compiled leaf and with the Python path it stands in for."""
    import json

    arguments = value
    if as_text:
        try:
            arguments = json.dumps(value)
        except (TypeError, ValueError):
            return
    assert compiled_and_python(tool, arguments)


def compiled_and_python(tool: str, arguments: Any) -> bool:
    """The signature with the compiled leaf equals the one of the Python path (fresh
    normalizers: no cached text signature answers for either)."""
    compiled = Normalizer().signature(tool, arguments)
    saved = signature_module._canonical, signature_module._canonical_json
    signature_module._canonical = signature_module._canonical_json = None  # type: ignore[misc]
    try:
        python = Normalizer().signature(tool, arguments)
    finally:
        signature_module._canonical, signature_module._canonical_json = saved  # type: ignore[misc]
    assert compiled == python, (tool, arguments)
    return True


json_numbers = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        ["1.0", "-0.0", "0.0", "1e5", "1E5", "2.5e-3", "1e400", "-1e400", "1e-400", "1e19", "9.3e18",
         "18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809",
         "123456789012345678901234567890", "1.5e308", "4.9e-324", "0.1", "100.000"]
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(numbers=st.lists(json_numbers, min_size=1, max_size=6), nested=st.booleans())
def test_json_numbers_get_the_python_signature(numbers: list[str], nested: bool) -> None:
    """Argument text is decoded without the float hook ahead of the compiled pass: integral,
    huge, tiny and out-of-range numbers, and integers wider than 64 bits, sign the same."""
    items = ", ".join(numbers)
    text = f'{{"q": [{items}], "n": {{"x": {numbers[0]}}}}}' if nested else f"[{items}]"
    assert compiled_and_python("search_docs", text)
    assert compiled_and_python("search_docs", f'{{"v": {numbers[-1]}, "request_id": 1}}')


def test_the_signature_of_a_repeated_text_is_remembered_within_bounds() -> None:
    """A text seen again gets the same signature object; the cache never outgrows its bounds
    and never holds texts above its size limit."""
    normalizer = Normalizer()
    text = '{"q": "refund policy", "limit": 10}'
    first = normalizer.signature("search_docs", text)
    assert normalizer.signature("search_docs", "".join(text)) is first  # equal text, new object
    assert normalizer.signature("other_tool", text) != first  # the tool is part of the key
    big = '{"q": "' + "x" * signature_module._CACHED_TEXT_MAX + '"}'
    normalizer.signature("search_docs", big)
    cache = normalizer._text_signatures
    assert ("search_docs", big) not in cache
    for i in range(3 * signature_module._TEXT_CACHE_MAX):
        normalizer.signature("search_docs", f'{{"q": {i}}}')
        assert len(cache) <= signature_module._TEXT_CACHE_MAX
    assert normalizer.signature("search_docs", text) == first  # correct after being emptied


def test_the_module_uses_the_compiled_leaf_unless_told_not_to() -> None:
    assert watch.COMPILED is True
    assert signature_module._canonical is _speedups.canonical
    assert signature_module._canonical_json is _speedups.canonical_text
    code = (
        "import tripwire.core.signature as s, tripwire.core.watch as w; "
        "print(s._canonical is None, s._canonical_json is None, w.COMPILED)"
    )
    env = {**os.environ, "TRIPWIRE_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"]


def test_the_leaf_helpers_leak_neither_memory_nor_references() -> None:
    import json

    keys = DEFAULT_NORMALIZER.volatile_keys
    tool = "search_docs_leak_check"
    results = ["Found 3 documents", '{"request_id": 1}', "plain", 7]
    spans = [
        {
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"call_{i}" if i % 3 else "<not specified>",
            "gen_ai.tool.call.arguments": f'{{"query": "{i}", "nonce": 1}}' if i % 4 == 0 else f'[{i}, {{"a": 1.5}}]',
            **({"gen_ai.tool.call.result": results[i % 4]} if i % 5 else {}),
        }
        for i in range(400)
    ]

    texts = [attrs["gen_ai.tool.call.arguments"] for attrs in spans]
    decoded = [json.loads(text) for text in texts]
    order = tuple(keys)
    long_text = json.dumps({f"k{i}": ["\u00e9" * 300, {"x": i}] for i in range(40)})  # buffers grow

    def run(n: int) -> None:
        for _ in range(n):
            for text in texts:
                _speedups.canonical_text(text, keys)
                _speedups.canonical_text(text.encode(), order)
            _speedups.canonical_text(long_text, order)
            _speedups.canonical_text(long_text + ",", order)  # declined after the buffers grew
            for value in decoded:
                _speedups.canonical(value, keys)
                _speedups.volatile_free(value, keys, 100)
                _speedups.canonical({"q": value, "n": 1.5, "request_id": tool}, keys)

    run(1)  # warm the caches (the tool's hash seed is cached: one reference to the name)
    refs_before = sys.getrefcount(tool)
    kept = bytes_kept(run)
    assert kept < 4096, f"{kept} bytes kept after 8,000 more calls"
    assert sys.getrefcount(tool) == refs_before
