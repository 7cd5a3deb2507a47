"""The compiled per-call bookkeeping of the loop watcher (``tripwire/core/_watchstep.c``) against
its reference, the Python path of ``evaluate_hashed``: the same calls fed to two states, one
through the compiled step and one with it switched off, give the same assessment at every call
and the same state after it, field by field. On random policies and calls (errors, progress,
non-retryable failures and declared polls included, which the step hands back to Python), and on
every session of the labelled corpus when it is at hand.

Skips, loudly, under ``TRIPWIRE_NO_EXTENSIONS=1`` or when the module was not built (under
``CI=true`` it must be built).
"""

from __future__ import annotations

import json
from array import array
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compiled_only import compiled_or_skip
from corpus_files import corpus_files
from tripwire.core import watch
from tripwire.core.events import ToolCall
from tripwire.core.policy import LoopPolicy, Poll
from tripwire.core.reasons import Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, EMPTY_RESULT, ArgsKind, Signature
from tripwire.core.watch import Assessment, RunState, evaluate
from tripwire.errors import ConfigError

_watchstep = compiled_or_skip("core._watchstep", "the compiled watcher bookkeeping")


def fields(state: RunState) -> dict[str, Any]:
    out = {}
    for name in RunState.__slots__:
        value = getattr(state, name)
        out[name] = value.tolist() if isinstance(value, array) else value
    return out


def both(
    policy: LoopPolicy, calls: list[ToolCall]
) -> tuple[list[Assessment | None], list[Assessment | None], int]:
    """Feed ``calls`` to a compiled-step state and a Python-path state; compare after each call.

    Returns both assessment lists and how many calls the compiled step took (not handed back).
    """
    fast, slow = RunState.new(policy), RunState.new(policy)
    got_fast: list[Assessment | None] = []
    got_slow: list[Assessment | None] = []
    taken = 0
    for i, call in enumerate(calls):
        sig = DEFAULT_NORMALIZER.signature(call.tool, call.arguments)
        digest = call.result_digest
        probe = fast.copy()
        if _watchstep.step(probe, call, sig.key, (hash(digest) or 1) if digest is not None else 0, policy) != -1:
            taken += 1
        got_fast.append(evaluate(fast, call, policy, DEFAULT_NORMALIZER, signature=sig))
        with mock.patch.object(watch, "_step", None):  # evaluate_hashed's Python path alone
            got_slow.append(evaluate(slow, call, policy, DEFAULT_NORMALIZER, signature=sig))
        assert got_fast[-1] == got_slow[-1], f"call {i + 1}: {call}"
        assert fields(fast) == fields(slow), f"state after call {i + 1}: {call}"
    return got_fast, got_slow, taken


@st.composite
def policies(draw: st.DrawFn) -> LoopPolicy:
    window = draw(st.integers(2, 12))
    kwargs: dict[str, Any] = {
        "window": window,
        "threshold": draw(st.integers(2, window)),
        "max_period": draw(st.none() | st.integers(2, 5)),
        "min_repeats": draw(st.integers(2, 4)),
        "same_error": draw(st.none() | st.integers(2, 5)),
        "same_result": draw(st.none() | st.integers(2, 5)),
        "revisit": draw(st.none() | st.integers(2, 5)),
        "revisit_memory": draw(st.integers(1, 6)),
        "revisit_share": draw(st.none() | st.sampled_from([0.3, 0.5, 0.8])),
        "failure_share": draw(st.none() | st.sampled_from([0.3, 0.8])),
        "mute_failures": draw(st.none() | st.integers(2, 4)),
        "confirm": draw(st.integers(1, 2)),
        "key": draw(st.sampled_from(["tool+args", "tool+args", "tool+args", "tool"])),
    }
    if draw(st.integers(0, 7)) == 0:
        kwargs["polls"] = {"poll": Poll(interval_s=5.0, max_wait_s=30.0)}
    try:
        return LoopPolicy(**kwargs)
    except ConfigError:
        assume(False)
        raise


@st.composite
def tool_calls(draw: st.DrawFn) -> ToolCall:
    tool = draw(st.sampled_from(["search", "read", "poll"]))
    arguments = {"q": draw(st.integers(0, 3))}
    result = draw(st.sampled_from([None, None, EMPTY_RESULT, "r1", "r2", "r3"]))
    fields: dict[str, Any] = {}
    rare = draw(st.integers(0, 11))
    if rare == 0:
        fields["error_type"] = draw(st.sampled_from(["TimeoutError", "ValueError"]))
    elif rare == 1:
        fields["error_type"] = "PermissionError"
        fields["retryable"] = False
    elif rare == 2:
        fields["progress"] = draw(st.sampled_from(["p1", "p2"]))
    return ToolCall(
        tool=tool,
        arguments=arguments,
        result_digest=None if result is None else DEFAULT_NORMALIZER.result_digest(result),
        start_s=float(draw(st.integers(0, 100))),
        **fields,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies(), st.lists(tool_calls(), max_size=60))
def test_the_compiled_step_leaves_every_verdict_and_every_field_of_the_state_as_the_python_path_does(
    policy: LoopPolicy, calls: list[ToolCall]
) -> None:
    both(policy, calls)


def test_clean_calls_are_taken_by_the_compiled_step_and_the_rest_handed_back_untouched() -> None:
    policy = LoopPolicy()
    clean = [ToolCall(tool="search", arguments={"q": i % 3}, result_digest=f"d{i % 2}") for i in range(30)]
    fast, _, taken = both(policy, clean)
    assert taken == 30
    assert any(a is not None and a.verdict is Verdict.STUCK for a in fast)

    state = RunState.new(policy)
    evaluate(state, clean[0], policy, DEFAULT_NORMALIZER)
    before = fields(state)
    for call in (
        ToolCall(tool="search", arguments={"q": 1}, error_type="TimeoutError"),
        ToolCall(tool="search", arguments={"q": 1}, progress="p"),
        ToolCall(tool="search", arguments={"q": 1}, retryable=False),
    ):
        sig = DEFAULT_NORMALIZER.signature(call.tool, call.arguments)
        assert _watchstep.step(state, call, sig.key, 0, policy) == -1
        assert fields(state) == before
    # a failure in the window: a call of another signature is the step's, a retry of the failed
    # one is Python's until the failure has left the window, when the step forgets it
    failing = RunState.new(policy)
    failed = ToolCall(tool="read", arguments={"path": "a"}, error_type="OSError")
    evaluate(failing, failed, policy, DEFAULT_NORMALIZER)
    retry = DEFAULT_NORMALIZER.signature("read", {"path": "a"}).key
    assert _watchstep.step(failing.copy(), clean[0], retry, 0, policy) == -1
    for i in range(policy.window - 1):
        assert _watchstep.step(failing, clean[0], 100 + i, 0, policy) != -1
    assert failing.failures and retry in failing.failures
    assert _watchstep.step(failing, clean[0], retry, 0, policy) != -1
    assert failing.failures == {}

    by_tool = LoopPolicy(key="tool")
    polled = LoopPolicy(polls={"search": Poll(interval_s=1.0, max_wait_s=5.0)})
    for other in (by_tool, polled):
        fresh = RunState.new(other)
        assert _watchstep.step(fresh, clean[0], 1, 0, other) == -1
        assert fresh.calls == 0


def test_a_class_whose_fields_are_not_slots_is_refused_and_the_python_path_stays() -> None:
    class Loose:
        pass

    with pytest.raises(TypeError, match="not a slot"):
        _watchstep.configure(Loose, ToolCall, {}, Verdict.WORKING, array, "tool+args", 1, 3)
    # the configuration watch.py made is still the one in force: the step still takes a clean call
    state, policy = RunState.new(LoopPolicy()), LoopPolicy()
    assert _watchstep.step(state, ToolCall(tool="t"), 7, 0, policy) != -1
    assert state.calls == 1


def test_keys_that_share_their_low_64_bits_are_told_apart_and_equal_keys_found_whatever_object_holds_them() -> None:
    # The step compares a key with the ring and ``recent`` by its low 64 bits first: keys that
    # differ only above them must still be different calls, and an equal key held by another
    # int object the same call.
    policy = LoopPolicy(window=10, threshold=4, max_period=3)
    base = 0x1234_5678_9ABC_DEF0_0FED_CBA9_8765_4321

    def key(high: int) -> int:
        return int(str(base + (high << 64)))  # a fresh object for every call

    def run(highs: list[int]) -> tuple[RunState, list[Assessment | None]]:
        fast, slow = RunState.new(policy), RunState.new(policy)
        got = []
        for i, high in enumerate(highs):
            call = ToolCall(tool="search", arguments={"q": high})
            sig = Signature(tool="search", key=key(high), kind=ArgsKind.JSON)
            got.append(evaluate(fast, call, policy, DEFAULT_NORMALIZER, signature=sig))
            with mock.patch.object(watch, "_step", None):
                assert evaluate(slow, call, policy, DEFAULT_NORMALIZER, signature=sig) == got[-1]
            assert fields(fast) == fields(slow), f"state after call {i + 1}"
        return fast, got

    state, got = run([0, 1, 2, 3, 4, 5, 6])  # seven different calls
    assert len(state.counts) == 7 and all(a is None or a.verdict is not Verdict.STUCK for a in got)
    state, got = run([5, 5, 5, 5])  # one call four times, each key a different object
    assert state.counts == {key(5): 4}
    assert got[-1] is not None and got[-1].verdict is Verdict.STUCK
    state, got = run([1, 2, 1, 2, 1, 2, 1, 2])  # a period-2 loop of two such keys
    assert len(state.counts) == 2 and any(a is not None and a.verdict is Verdict.STUCK for a in got)


def corpus_sessions() -> list[list[ToolCall]]:
    sessions = []
    for path in corpus_files():
        data: Any = json.loads(path.read_text())
        calls = []
        for rs in data.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    attrs = {a["key"]: a["value"].get("stringValue") for a in span.get("attributes", [])}
                    if attrs.get("gen_ai.tool.name") is None:
                        continue
                    result = attrs.get("gen_ai.tool.call.result")
                    calls.append(
                        (
                            int(span.get("startTimeUnixNano", 0)),
                            ToolCall(
                                tool=attrs["gen_ai.tool.name"],
                                arguments=attrs.get("gen_ai.tool.call.arguments") or "{}",
                                result_digest=None if result is None else DEFAULT_NORMALIZER.result_digest(result),
                                error_type="Error" if span.get("status", {}).get("code") == 2 else None,
                            ),
                        )
                    )
        calls.sort(key=lambda c: c[0])
        sessions.append([c for _, c in calls])
    return sessions


def test_every_corpus_session_gets_the_same_verdicts_and_state_either_way() -> None:
    sessions = corpus_sessions()
    taken = total = stuck = 0
    for calls in sessions:
        fast, _, took = both(LoopPolicy(), calls)
        taken += took
        total += len(calls)
        stuck += any(a is not None and a.verdict is Verdict.STUCK for a in fast)
    assert total > 10_000
    assert taken > total * 3 // 4  # most real calls are the ones the step takes
    assert stuck > 50  # and the sessions reach the verdicts that matter
