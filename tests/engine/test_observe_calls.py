"""Engine.observe_calls: one run's tool calls as a batch, the same as observe() call by call."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core.budget import Limits
from tripwire.core.events import ToolCall
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.core.watch import Assessment
from tripwire.engine import Engine, StillStuck, ToolSpan, VerdictChanged
from tripwire.errors import ConfigError

_CALLS = st.lists(
    st.builds(
        ToolCall,
        tool=st.sampled_from(["search_docs", "read_file", "run_tests"]),
        arguments=st.sampled_from(['{"q": "refund"}', '{"q": "refund"}', '{"q": "shipping"}', "{}"]),
        call_id=st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3", "c4"])),
        error_type=st.one_of(st.none(), st.just("TimeoutError")),
        result_digest=st.sampled_from([None, "a" * 32, "b" * 32]),
    ),
    max_size=40,
)
_LIMITS = st.sampled_from([None, Limits(max_tool_calls=12), Limits(max_duplicate_calls=3)])


def _one_by_one(engine: Engine, calls: list[ToolCall], signed: bool) -> list[tuple[int, object]]:
    out: list[tuple[int, object]] = []
    for i, call in enumerate(calls):
        sig = DEFAULT_NORMALIZER.signature(call.tool, call.arguments) if signed else None
        out += [(i, d) for d in engine.observe(ToolSpan(trace_id="t", call=call, signature=sig))]
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=_CALLS, limits=_LIMITS, signed=st.booleans(), split=st.integers(0, 40))
def test_a_batch_brings_the_decisions_and_counts_of_the_same_calls_one_by_one(
    calls: list[ToolCall], limits: Limits | None, signed: bool, split: int
) -> None:
    single = Engine(limits=limits, clock=lambda: 0.0)
    expected = _one_by_one(single, calls, signed)
    batched = Engine(limits=limits, clock=lambda: 0.0)
    sigs = [DEFAULT_NORMALIZER.signature(c.tool, c.arguments) if signed else None for c in calls]
    # Two batches, cut anywhere: a run goes on across batches.
    got = batched.observe_calls("t", calls[:split], sigs[:split])
    got += [(split + i, d) for i, d in batched.observe_calls("t", calls[split:], sigs[split:])]
    assert got == expected
    assert batched.stats == single.stats
    assert batched.verdict("t") == single.verdict("t")
    assert batched.counters("t") == single.counters("t")


def test_a_repeated_call_is_stuck_at_the_fourth_and_says_so_again_after() -> None:
    engine = Engine(clock=lambda: 0.0)
    calls = [ToolCall(tool="search_docs", arguments='{"q": "refund"}') for _ in range(6)]
    decisions = engine.observe_calls("t", calls, [None] * 6)
    assert [(i, type(d)) for i, d in decisions] == [
        (3, VerdictChanged), (4, StillStuck), (5, StillStuck)
    ]
    first = decisions[0][1]
    assert isinstance(first, VerdictChanged) and first.stuck and first.assessment.call_index == 4


def test_one_signature_per_call_is_required() -> None:
    engine = Engine(clock=lambda: 0.0)
    with pytest.raises(ConfigError):
        engine.observe_calls("t", [ToolCall(tool="x", arguments="{}")], [])
    assert engine.observe_calls("t", [], []) == []
    assert "t" not in engine


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=_CALLS, limits=_LIMITS)
def test_a_batch_tells_the_verdict_in_force_after_each_call_and_which_were_second_reports(
    calls: list[ToolCall], limits: Limits | None
) -> None:
    single = Engine(limits=limits, clock=lambda: 0.0)
    expected: list[Assessment | bool | None] = []
    for call in calls:
        counted = single.stats.tool_calls
        single.observe(ToolSpan(trace_id="t", call=call))
        expected.append(single.verdict("t") if single.stats.tool_calls > counted else False)
    batched = Engine(limits=limits, clock=lambda: 0.0)
    verdicts: list[Assessment | bool | None] = []
    batched.observe_calls("t", calls, [None] * len(calls), verdicts=verdicts)
    assert verdicts == expected


def test_a_second_report_of_a_call_is_marked_and_a_retry_after_an_error_is_not() -> None:
    engine = Engine(clock=lambda: 0.0)
    calls = [
        ToolCall(tool="read_file", arguments="{}", call_id="c1"),
        ToolCall(tool="read_file", arguments="{}", call_id="c1"),  # the same execution again
        ToolCall(tool="run_tests", arguments="{}", call_id="c2", error_type="TimeoutError"),
        ToolCall(tool="run_tests", arguments="{}", call_id="c2"),  # a new attempt
    ]
    verdicts: list[Assessment | bool | None] = []
    engine.observe_calls("t", calls, [None] * 4, verdicts=verdicts)
    assert [v is False for v in verdicts] == [False, True, False, False]
    assert all(v == engine.verdict("t") for v in verdicts if v is not False)
    assert engine.stats.tool_calls == 3 and engine.stats.duplicate_calls == 1


def test_last_active_is_the_clock_at_a_runs_last_call() -> None:
    now = [5.0]
    engine = Engine(clock=lambda: now[0], idle_ttl_s=10)
    assert engine.last_active("t") is None
    engine.observe_calls("t", [ToolCall(tool="x", arguments="{}")], [None])
    now[0] = 7.5
    engine.observe(ToolSpan(trace_id="t", call=ToolCall(tool="y", arguments="{}")))
    assert engine.last_active("t") == 7.5
    engine.end("t")
    assert engine.last_active("t") is None
