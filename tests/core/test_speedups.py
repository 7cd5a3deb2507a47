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
from tripwire.otel.conventions import _tool_call  # binds the compiled tool-span mapping
from tripwire.otel.processor import _py_remember_id

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


# -- the compiled tool-span mapping ------------------------------------------------------------

TOOL_KEYS = [
    "gen_ai.tool.name", "gen_ai.tool.call.arguments", "gen_ai.tool.call.id",
    "gen_ai.tool.call.result", "error.type", "pydantic_ai.tool.retry.attempt", "tool.name",
    "output.value", "input.value", "http.route", "tool_response", "traceloop.entity.output",
    "gcp.vertex.agent.tool_response", "pydantic_ai.tool.retry.cause",
]  # fmt: skip
RESULT_KEYS = ["gen_ai.tool.call.result", "output.value", "tool_response", "traceloop.entity.output"]
MAY_HOLD_VOLATILE = DEFAULT_NORMALIZER._may_hold_volatile


class Text(str):
    """A str subclass (the Python mapping keeps it as it is)."""


span_values = st.one_of(
    json_texts(),
    st.sampled_from(
        [
            "search_docs", "", "<not specified>", "call_1", '{"input_str": "x", "inputs": {}}',
            '{"inputs": {"q": 1}, "input_str": "x"}', '{"args": [], "kwargs": {"q": 1}}',
            '{"input_string": 1}', '{"q_1": "a"}', "{}",
            # results: plain, with digits, a ToolMessage, an ADK retry report, volatile keys
            "Found 3 documents", "no_results", "ok \ud800", '{"status": "ok", "n": 12}',
            '{"type": "tool", "data": {"content": "x", "tool_call_id": "call_7"}}',
            '{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": "E"}',
            '{"rows": 1, "request_id": "r-1"}', '{"\\u006eonce": 2}',
        ]
    ),
    st.text(max_size=10),
    st.integers(-3, 3),
    st.booleans(),
    st.builds(Text, st.sampled_from(["search_docs", "call_2", '{"q": 1}'])),
)  # fmt: skip
span_attrs = st.builds(
    lambda tool, args, result, extra: {**extra, **tool, **args, **result},
    st.fixed_dictionaries({}, optional={"gen_ai.tool.name": st.sampled_from(["search_docs", "é"]) | span_values}),
    st.fixed_dictionaries({}, optional={"gen_ai.tool.call.arguments": span_values}),
    st.dictionaries(st.sampled_from(RESULT_KEYS), span_values, max_size=2),
    st.dictionaries(st.sampled_from(TOOL_KEYS), span_values, max_size=3),
)
nanos = st.none() | st.integers(0, 2**63 - 1)


@settings(max_examples=1500, deadline=None)
@given(attrs=span_attrs, start=nanos, end=nanos)
def test_tool_span_agrees_with_the_python_mapping(
    attrs: dict[str, Any], start: int | None, end: int | None
) -> None:
    normalizer = DEFAULT_NORMALIZER
    got = _speedups.tool_span(
        attrs, start, end, normalizer.volatile_keys, normalizer.max_bytes, MAY_HOLD_VOLATILE
    )
    if got is None:
        return
    call, sig = got
    expected = _tool_call(
        attrs,
        "execute_tool x",
        None if start is None else start / 1e9,
        None if end is None else end / 1e9,
        None,
        normalizer,
    )
    assert expected is not None
    assert call == expected
    assert [type(getattr(call, f)) for f in call.__struct_fields__] == [
        type(getattr(expected, f)) for f in expected.__struct_fields__
    ]
    if sig is not None:
        assert sig == pure_signature(call.tool, call.arguments)


def tool_span(attrs: dict[str, Any], start: int | None = None, end: int | None = None) -> Any:
    n = DEFAULT_NORMALIZER
    return _speedups.tool_span(attrs, start, end, n.volatile_keys, n.max_bytes, MAY_HOLD_VOLATILE)


def test_tool_span_maps_the_common_span_and_leaves_the_rest() -> None:
    plain = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search_docs",
        "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.call.arguments": '{"query": "refund", "max_results": 5}',
    }
    got = tool_span(plain, 1_000_000_000, 3_000_000_000)
    assert got is not None
    call, sig = got
    assert (call.tool, call.call_id, call.start_s, call.end_s) == ("search_docs", "call_1", 1.0, 3.0)
    assert call.result_digest is None
    assert sig is not None and sig == pure_signature("search_docs", call.arguments)
    no_id = {**plain, "gen_ai.tool.call.id": "<not specified>"}
    assert tool_span(no_id)[0].call_id is None
    # A plain result is digested as the Python mapping digests it (digits do not count).
    with_result = {**plain, "tool_response": "Found 3 documents"}
    call = tool_span(with_result)[0]
    assert call.result_digest == _tool_call(with_result, "x", None, None, None).result_digest
    assert call.result_digest == tool_span({**plain, "tool_response": "Found 12 documents"})[0].result_digest
    assert call.result_digest != tool_span({**plain, "tool_response": "Found no documents"})[0].result_digest
    # Answered in Python: an error or retry attribute, a result to unwrap or strip, an
    # envelope, no arguments, no usable tool name.
    for attrs in (
        {**plain, "error.type": "ValueError"},
        {**plain, "pydantic_ai.tool.retry.cause": "x"},
        {**plain, "gen_ai.tool.call.result": '{"content": "x", "tool_call_id": "call_1"}'},
        {**plain, "gen_ai.tool.call.result": '{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"}'},
        {**plain, "gen_ai.tool.call.result": '{"rows": [], "request_id": "r-1"}'},
        {**plain, "gen_ai.tool.call.result": 42},
        {**plain, "gen_ai.tool.call.arguments": '{"input_str": "x", "inputs": {"q": 1}}'},
        {**plain, "gen_ai.tool.call.arguments": '{"tags": [], "inputs": {}, "input_str": "x"}'},
        {**plain, "gen_ai.tool.call.arguments": '{"args": [], "sanitize_inputs_outputs": true}'},
        {k: v for k, v in plain.items() if k != "gen_ai.tool.call.arguments"},
        {**plain, "gen_ai.tool.name": ""},
        {**plain, "gen_ai.tool.name": Text("search_docs")},
    ):
        assert tool_span(attrs) is None, attrs
    # Volatile keys in the arguments: the call is mapped, the signature left to Python.
    got = tool_span({**plain, "gen_ai.tool.call.arguments": '{"nonce": 1}'})
    assert got is not None and got[1] is None
    with pytest.raises(TypeError, match="6 arguments"):
        _speedups.tool_span(plain, None, None)


# -- the compiled call-id memory ---------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.sampled_from([f"call_{i}" for i in range(24)]), max_size=60), memory=st.integers(1, 17))
def test_remember_id_agrees_with_its_python_twin(ids: list[str], memory: int) -> None:
    c_ids: bytes | None = None
    py_ids: bytes | None = None
    for text in ids:
        c_new = _speedups.remember_id(c_ids, text, memory)
        py_new = _py_remember_id(py_ids, text, memory)
        assert (c_new is c_ids) == (py_new is py_ids)
        assert c_new == py_new
        c_ids, py_ids = c_new, py_new


def test_remember_id_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="bytes or None"):
        _speedups.remember_id(bytearray(8), "a", 4)
    with pytest.raises(ValueError, match="memory must be >= 1"):
        _speedups.remember_id(None, "a", 0)
    with pytest.raises(TypeError, match="unhashable"):
        _speedups.remember_id(None, ["a"], 4)


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
        ids: bytes | None = None
        for _ in range(n):
            for i, attrs in enumerate(spans):
                _speedups.tool_span(attrs, i, i + 1, keys, cap, MAY_HOLD_VOLATILE)
                _speedups.json_signature(tool, attrs["gen_ai.tool.call.arguments"], keys, cap)
                ids = _speedups.remember_id(ids, attrs["gen_ai.tool.call.id"], 16)

    run(1)  # warm the caches (the tool's hash seed is cached: one reference to the name)
    refs_before = sys.getrefcount(tool)
    kept = bytes_kept(run)
    assert kept < 4096, f"{kept} bytes kept after 8,000 more spans"
    assert sys.getrefcount(tool) == refs_before
