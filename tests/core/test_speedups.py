"""The compiled hot path (``tripwire/core/_speedups.c``) against the Python reference in
``tripwire/core/watch.py``: the same verdicts and the same state, call by call.

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
from hypothesis import given, settings
from hypothesis import strategies as st

from tripwire.core.signature import DEFAULT_NORMALIZER

try:
    from tripwire.core import _speedups
except ImportError:  # pragma: no cover - depends on the build
    _speedups = None  # type: ignore[assignment]

if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
    pytest.skip(
        "SKIPPED LOUDLY: TRIPWIRE_NO_EXTENSIONS is set, so the compiled accelerator is not in "
        "use; only the Python reference was tested",
        allow_module_level=True,
    )
if _speedups is None:
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(
            "tripwire.core._speedups was not built: the install must compile "
            "src/tripwire/core/_speedups.c (is a C compiler missing?)"
        )
    pytest.skip(
        "SKIPPED LOUDLY: the compiled accelerator tripwire.core._speedups is not built "
        "(pip install -e . needs a C compiler); only the Python reference was tested",
        allow_module_level=True,
    )


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


# -- the compiled signature of JSON text ---------------------------------------------------------

json_keys = st.sampled_from(["q", "page", "nonce", "request_id", "a_b", "é", "limit"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(json_keys, children, max_size=4),
    max_leaves=20,
)


@st.composite
def json_texts(draw: st.DrawFn) -> str:
    """JSON text as emitters write it, and text that only looks like JSON."""
    import json

    value = draw(json_values)
    text = json.dumps(
        value,
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([None, (",", ":")])),
        sort_keys=draw(st.booleans()),
    )
    text = draw(st.sampled_from(["", " ", "\n\t"])) + text
    mangle = draw(st.sampled_from(["none", "truncate", "escape", "float"]))
    if mangle == "truncate" and len(text) > 2:
        text = text[: draw(st.integers(1, len(text) - 1))]
    elif mangle == "escape":
        text = text.replace('"nonce"', '"\\u006eonce"')
    elif mangle == "float":
        text = text.replace("1", "1.0", 1)
    return text


def pure_signature(tool: str, arguments: Any, normalizer: Any = DEFAULT_NORMALIZER) -> Any:
    """Normalizer.signature without the compiled JSON path (the Python reference)."""
    return normalizer._python_signature(tool, arguments)


@settings(max_examples=600, deadline=None)
@given(text=json_texts(), tool=st.sampled_from(["search_docs", "t", "é"]), small=st.booleans())
def test_json_signature_agrees_with_the_python_path(text: str, tool: str, small: bool) -> None:
    from tripwire.core.signature import Normalizer

    normalizer = Normalizer(max_bytes=64) if small else DEFAULT_NORMALIZER
    got = _speedups.json_signature(tool, text, normalizer.volatile_keys, normalizer.max_bytes)
    assert got is None or got == pure_signature(tool, text, normalizer)
    assert normalizer.signature(tool, text) == pure_signature(tool, text, normalizer)


def test_json_signature_answers_the_common_case_and_leaves_the_rest() -> None:
    keys, cap = DEFAULT_NORMALIZER.volatile_keys, DEFAULT_NORMALIZER.max_bytes
    common = ['{"query": "refund policy", "page": 2}', ' [1, {"b": 2.5, "a": null}]']
    for text in common:
        got = _speedups.json_signature("t", text, keys, cap)
        assert got is not None and got == pure_signature("t", text)
    python_only = [
        '{"query": "x", "nonce": "abc"}',  # a volatile key: stripped in Python
        '{"query": "é"}',  # not ASCII
        '"a string"',  # not an object or an array
        "42",
        "{broken",
        "",
        "x" * 10,
        "[" + "1," * cap + "1]",  # over the cap
    ]
    for text in python_only:
        assert _speedups.json_signature("t", text, keys, cap) is None, text
    assert _speedups.json_signature("t", '{"a": 1}', ["not", "a", "set"], cap) is None
    with pytest.raises(TypeError, match="4 arguments"):
        _speedups.json_signature("t", "{}")


def test_the_span_helpers_leak_neither_memory_nor_references() -> None:
    keys, cap = DEFAULT_NORMALIZER.volatile_keys, DEFAULT_NORMALIZER.max_bytes
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

    def run(n: int) -> None:
        for _ in range(n):
            for attrs in spans:
                _speedups.json_signature(tool, attrs["gen_ai.tool.call.arguments"], keys, cap)

    run(1)  # warm the caches (the tool's hash seed is cached: one reference to the name)
    refs_before = sys.getrefcount(tool)
    kept = bytes_kept(run)
    assert kept < 4096, f"{kept} bytes kept after 8,000 more spans"
    assert sys.getrefcount(tool) == refs_before
