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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core import watch
from tripwire.core.events import ABSENT, Lease, ToolCall
from tripwire.core.policy import LoopPolicy, RetryPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER, signature_of

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

C_STATE = _speedups.RunState
C_EVALUATE = _speedups.evaluate
PY_STATE = watch.PyRunState
PY_EVALUATE = watch.py_evaluate

# -- strategies --------------------------------------------------------------------------------

shares = st.none() | st.sampled_from([0.3, 0.5, 0.8, 1.0])


@st.composite
def policies(draw: st.DrawFn) -> LoopPolicy:
    window = draw(st.integers(2, 12))
    retry = draw(
        st.none()
        | st.builds(
            RetryPolicy,
            errors=st.sampled_from([frozenset(), frozenset({"Timeout"}), frozenset({"Timeout", "RateLimit"})]),
            retryable_flag=st.booleans(),
            max_attempts=st.integers(1, 4),
            interval_s=st.sampled_from([0.0, 1.0, 2.0]),
            backoff_rate=st.sampled_from([1.0, 2.0]),
            tolerance_s=st.sampled_from([0.0, 0.5]),
        )
    )
    return LoopPolicy(
        window=window,
        threshold=draw(st.integers(2, window)),
        key=draw(st.sampled_from(["tool+args", "tool"])),
        max_period=draw(st.none() | st.integers(2, 5)),
        min_repeats=draw(st.integers(2, 3)),
        same_error=draw(st.none() | st.integers(2, 4)),
        same_result=draw(st.none() | st.integers(2, 4)),
        revisit=draw(st.none() | st.integers(2, 4)),
        revisit_memory=draw(st.integers(1, 8)),
        revisit_share=draw(shares),
        failure_share=draw(shares),
        result_evidence=draw(st.sampled_from(["off", "polling", "all"])),
        polling_tools=draw(st.sampled_from([frozenset(), frozenset({"poll"})])),
        require_evidence=draw(st.booleans()),
        name_only=draw(st.sampled_from(["uncertain", "stuck"])),
        retry=retry,
        confirm=draw(st.integers(1, 2)),
    )


@st.composite
def calls(draw: st.DrawFn) -> list[ToolCall]:
    """A run drawn from a small alphabet, so that repeats, cycles and streaks are common."""
    out: list[ToolCall] = []
    t = 0.0
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.sampled_from([0.1, 1.0, 3.0]))
        captured = draw(st.integers(0, 9)) > 0
        error = draw(st.sampled_from([None, None, None, "Timeout", "RateLimit", "ValueError"]))
        out.append(
            ToolCall(
                tool=draw(st.sampled_from(["search", "read", "poll"])),
                arguments={"q": draw(st.integers(0, 2))} if captured else ABSENT,
                start_s=t,
                end_s=t + 0.05,
                error_type=error,
                retryable=draw(st.sampled_from([None, None, True, False])),
                attempt=draw(st.none() | st.integers(1, 4)),
                result_digest=draw(st.sampled_from([None, "r0", "r1", "r2"])),
                progress=draw(st.sampled_from([None, None, None, "p0", "p1"])),
                lease=draw(
                    st.sampled_from([None, None, None, Lease(owner="ci", deadline_s=50.0, renewals=1)])
                ),
            )
        )
    return out


def views(state: Any) -> dict[str, Any]:
    """Everything the two states must agree on, in comparable form."""
    results = state.results
    marks = state.marks
    seen = state.seen
    return {
        "calls": state.calls,
        "keys": list(state.keys),
        "counts": dict(state.counts),
        "recent": list(state.recent),
        "runs": dict(state.runs),
        "results": None if results is None else list(results),
        "progress": None if state.progress is None else list(state.progress),
        "marks": None if marks is None else bytes(marks),
        "seen": None if seen is None else bytes(seen),
        "seen_at": state.seen_at,
        "failures": None if state.failures is None else dict(state.failures),
        "last_tool": state.last_tool,
        "last_result": state.last_result,
        "last_error": state.last_error,
        "outcome_run": state.outcome_run,
        "revisit_run": state.revisit_run,
        "error_run": state.error_run,
        "failed_recent": state.failed_recent,
        "revisits_recent": state.revisits_recent,
        "last_trip": state.last_trip,
        "confirm_streak": state.confirm_streak,
        "lease": state.lease,
        "current": state.current,
    }


# -- the differential test ---------------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=policies(), run=calls(), precomputed=st.booleans(), run_lease=st.booleans())
def test_compiled_and_reference_agree_call_by_call(
    policy: LoopPolicy, run: list[ToolCall], precomputed: bool, run_lease: bool
) -> None:
    py_state = PY_STATE.new(policy)
    c_state = C_STATE.new(policy)
    if run_lease:
        lease = Lease(owner="deploy", deadline_s=30.0)
        py_state.lease = lease
        c_state.lease = lease
    normalizer = DEFAULT_NORMALIZER
    for i, call in enumerate(run):
        sig = normalizer.signature(call.tool, call.arguments) if precomputed else None
        expected = PY_EVALUATE(py_state, call, policy, normalizer, signature=sig, now_s=call.end_s)
        got = C_EVALUATE(c_state, call, policy, normalizer, signature=sig, now_s=call.end_s)
        assert got == expected, f"call {i + 1}: {got!r} != {expected!r}"
        assert views(c_state) == views(py_state), f"state differs after call {i + 1}"


def test_the_module_uses_the_compiled_path_unless_told_not_to() -> None:
    assert watch.COMPILED is True
    assert watch.RunState is C_STATE
    assert watch.evaluate is C_EVALUATE
    code = "import tripwire.core.watch as w; print(w.COMPILED, w.RunState is w.PyRunState)"
    env = {**os.environ, "TRIPWIRE_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


# -- the C boundary: clear errors, no leaks ----------------------------------------------------


def test_wrong_arguments_are_clear_type_errors() -> None:
    policy = LoopPolicy()
    state = C_STATE.new(policy)
    call = ToolCall(tool="t")
    with pytest.raises(TypeError, match="RunState"):
        C_EVALUATE(PY_STATE.new(policy), call, policy, DEFAULT_NORMALIZER)
    with pytest.raises(TypeError, match="missing required argument 'normalizer'"):
        C_EVALUATE(state, call, policy)
    with pytest.raises(TypeError, match="unexpected keyword argument 'signatur'"):
        C_EVALUATE(state, call, policy, DEFAULT_NORMALIZER, signatur=None)
    with pytest.raises(TypeError, match="multiple values for argument 'call'"):
        C_EVALUATE(state, call, policy, DEFAULT_NORMALIZER, call=call)
    with pytest.raises(TypeError, match="4 positional arguments"):
        C_EVALUATE(state, call, policy, DEFAULT_NORMALIZER, None)
    assert state.calls == 0  # nothing was recorded by a refused call


def test_a_policy_with_another_window_is_refused_by_name() -> None:
    state = C_STATE.new(LoopPolicy(window=10))
    with pytest.raises(ValueError, match=r"window \(20\) differs .* RunState.new\(policy\)"):
        C_EVALUATE(state, ToolCall(tool="t"), LoopPolicy(window=20), DEFAULT_NORMALIZER)


def test_keywords_work_for_every_parameter() -> None:
    policy = LoopPolicy(window=4, threshold=2)
    state = C_STATE.new(policy)
    call = ToolCall(tool="t", arguments={"a": 1})
    C_EVALUATE(state=state, call=call, policy=policy, normalizer=DEFAULT_NORMALIZER)
    got = C_EVALUATE(state, call, normalizer=DEFAULT_NORMALIZER, policy=policy, now_s=1.0)
    assert got is not None and got.rule is not None and got.call_index == 2


def test_a_long_run_leaks_neither_memory_nor_references() -> None:
    policy = LoopPolicy()
    digest = "result-digest-that-is-shared"
    calls = [
        ToolCall(
            tool="t",
            arguments={"i": i % 37},
            result_digest=digest if i % 3 else None,
            progress="p" if i % 5 == 0 else None,
            error_type="E" if i % 7 == 0 else None,
        )
        for i in range(400)
    ]
    sigs = [signature_of(c.tool, c.arguments) for c in calls]
    refs_before = sys.getrefcount(digest)

    def run(n: int) -> None:
        state = C_STATE.new(policy)
        for _ in range(n):
            for call, sig in zip(calls, sigs, strict=True):
                C_EVALUATE(state, call, policy, DEFAULT_NORMALIZER, signature=sig)

    run(1)  # warm the caches
    kept = bytes_kept(run)
    assert kept < 4096, f"{kept} bytes kept after 8,000 more calls"
    assert sys.getrefcount(digest) == refs_before


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


def test_a_state_in_a_reference_cycle_is_collected() -> None:
    import weakref

    policy = LoopPolicy(window=3, threshold=2)

    class Box:
        pass

    box = Box()
    state = C_STATE.new(policy)
    state.lease = box  # the state refers to box ...
    box.state = state  # type: ignore[attr-defined]  # ... and box to the state
    ref = weakref.ref(box)
    del box, state
    gc.collect()
    assert ref() is None


def test_sizeof_counts_the_rings() -> None:
    small = C_STATE.new(LoopPolicy(window=10, threshold=4))
    large = C_STATE.new(LoopPolicy(window=100, threshold=4))
    # 90 more ring slots (a key pointer and a 32-bit hash each) and a larger table
    assert sys.getsizeof(large) - sys.getsizeof(small) >= 90 * (8 + 4) + 90 * 16


# -- the compiled volatile-key walk ------------------------------------------------------------

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
