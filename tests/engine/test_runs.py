"""The per-run engine: mapped events in, decisions out, bounded memory, no OpenTelemetry."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tripwire.core.budget import Limits
from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import Rule, StopReason, Verdict
from tripwire.engine import (
    CALL_ID_MEMORY,
    Boundary,
    BudgetStopped,
    Engine,
    ModelSpan,
    RunEnded,
    StillStuck,
    ToolSpan,
    VerdictChanged,
)
from tripwire.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def tool(
    trace: int | str = 1,
    name: str = "search_docs",
    query: str = "refund policy",
    *,
    call_id: str | None = None,
    error: str | None = None,
    result: str | None = None,
    root: bool = False,
    at: float | None = None,
) -> ToolSpan:
    call = ToolCall(
        tool=name,
        arguments={"query": query},
        call_id=call_id,
        error_type=error,
        result_digest=result,
        start_s=at,
        end_s=at,
    )
    return ToolSpan(trace_id=trace, call=call, root=root)


def test_a_loop_is_one_verdict_change_at_the_fourth_call() -> None:
    engine = Engine(clock=Clock())
    out = [engine.observe(tool()) for _ in range(4)]
    assert out[:3] == [(), (), ()]  # the first "working" is not news
    (change,) = out[3]
    assert isinstance(change, VerdictChanged) and change.stuck
    assert (change.assessment.rule, change.assessment.call_index) == (Rule.REPETITION, 4)
    assert change.previous is Verdict.WORKING
    assert engine.verdict(1) is change.assessment


def test_a_stuck_run_that_repeats_again_says_so_at_each_repeated_call() -> None:
    """Nudge, then kill: the caller can re-raise a lowered stop at the next repeated call."""
    engine = Engine(clock=Clock())
    for _ in range(4):
        engine.observe(tool())
    (again,) = engine.observe(tool())
    assert isinstance(again, StillStuck) and again.call_index == 5
    assert again.assessment.verdict is Verdict.STUCK
    assert again.assessment.hits == 5  # the verdict in force now, counting the repeat
    assert engine.verdict(1) is again.assessment


def test_a_run_that_obeys_the_nudge_is_not_told_again() -> None:
    engine = Engine(clock=Clock())
    for _ in range(4):
        engine.observe(tool())
    out = [engine.observe(tool(query=f"other topic {c}")) for c in "abcdef"]
    assert not any(isinstance(d, StillStuck) for ds in out for d in ds)


def test_runs_are_judged_separately() -> None:
    engine = Engine(clock=Clock())
    for i in range(4):
        engine.observe(tool(trace="a"))
        engine.observe(tool(trace="b", query=f"topic {i}"))
    assert engine.verdict("a").verdict is Verdict.STUCK  # type: ignore[union-attr]
    assert engine.verdict("b").verdict is Verdict.WORKING  # type: ignore[union-attr]


# -- call ids: duplicates and attempts ------------------------------------------------------


def test_partial_reports_of_one_call_count_once() -> None:
    engine = Engine(clock=Clock())
    for _ in range(6):
        engine.observe(tool(call_id="call_1"))
    assert engine.stats.tool_calls == 1 and engine.stats.duplicate_calls == 5
    assert engine.verdict(1).verdict is Verdict.WORKING  # type: ignore[union-attr]


def test_attempts_after_an_error_are_separate_calls_with_attempt_numbers() -> None:
    """LangChain's ToolRetryMiddleware: one span per attempt, one tool_call_id, failed ones
    with status ERROR."""
    seen: list[ToolCall] = []
    engine = Engine(clock=Clock())
    import tripwire.engine._engine as module

    real = module.evaluate_hashed

    def spy(state, call, *a, **kw):  # type: ignore[no-untyped-def]
        seen.append(call)
        return real(state, call, *a, **kw)

    module.evaluate_hashed = spy  # type: ignore[assignment]
    try:
        engine.observe(tool(call_id="c", error="TimeoutError"))
        engine.observe(tool(call_id="c", error="TimeoutError"))
        engine.observe(tool(call_id="c"))  # the third attempt succeeds
        engine.observe(tool(call_id="c"))  # a duplicate report of the successful execution
    finally:
        module.evaluate_hashed = real  # type: ignore[assignment]
    assert [c.attempt for c in seen] == [None, 2, 3]
    assert (engine.stats.tool_calls, engine.stats.attempts, engine.stats.duplicate_calls) == (3, 2, 1)


def test_the_call_id_memory_keeps_the_last_ids_only() -> None:
    engine = Engine(clock=Clock())
    ids = [f"call_{i}" for i in range(CALL_ID_MEMORY + 1)]
    for i, call_id in enumerate(ids):
        engine.observe(tool(query=str(i), call_id=call_id))
    for i, call_id in enumerate(ids[1:], start=1):
        engine.observe(tool(query=str(i), call_id=call_id))
    assert engine.stats.duplicate_calls == CALL_ID_MEMORY
    engine.observe(tool(query="0", call_id=ids[0]))  # forgotten: counted again
    assert engine.stats.tool_calls == CALL_ID_MEMORY + 2


# -- boundaries and memory -------------------------------------------------------------------


def test_a_sub_agent_end_restarts_the_window_and_the_root_ends_the_run() -> None:
    engine = Engine(clock=Clock())
    for _ in range(3):
        engine.observe(tool())
    assert engine.observe(Boundary(trace_id=1)) == ()
    assert engine.run_state(1) is None
    for _ in range(3):
        assert engine.observe(tool()) == ()  # three more: no loop across the boundary
    (ended,) = engine.observe(Boundary(trace_id=1, root=True))
    assert isinstance(ended, RunEnded) and ended.cause == "root" and ended.tool_calls == 3
    assert len(engine) == 0


def test_a_root_tool_span_is_judged_then_ends_its_run() -> None:
    engine = Engine(clock=Clock())
    for _ in range(3):
        engine.observe(tool())
    change, ended = engine.observe(tool(root=True))
    assert isinstance(change, VerdictChanged) and change.stuck
    assert isinstance(ended, RunEnded) and ended.verdict is change.assessment
    assert 1 not in engine


def test_runs_are_bounded_by_count_and_idle_time() -> None:
    clock = Clock()
    engine = Engine(clock=clock, max_traces=3, idle_ttl_s=10)
    for t in range(5):
        engine.observe(tool(trace=t))
    assert len(engine) == 3 and engine.stats.evicted_lru == 2
    assert 0 not in engine and 4 in engine
    clock.now = 11.0
    assert engine.evict_idle() == 3 and len(engine) == 0


def test_bad_configuration_names_the_field() -> None:
    for kwargs, field in [
        ({"max_traces": 0}, "max_traces"),
        ({"idle_ttl_s": -1}, "idle_ttl_s"),
        ({"limits": {"max_steps": 3}}, "limits"),
    ]:
        with pytest.raises(ConfigError) as info:
            Engine(clock=Clock(), **kwargs)  # type: ignore[arg-type]
        assert info.value.field == field
    with pytest.raises(ConfigError):
        Engine("default", clock=Clock())  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Engine(clock=Clock()).observe("a span")  # type: ignore[arg-type]


# -- budgets ---------------------------------------------------------------------------------


def test_a_tool_call_cap_stops_when_the_nth_call_ends() -> None:
    engine = Engine(LoopPolicy(), limits=Limits(max_tool_calls=3), clock=Clock())
    assert engine.observe(tool(query="a")) == ()
    assert engine.observe(tool(query="b")) == ()
    (stop,) = engine.observe(tool(query="c"))
    assert isinstance(stop, BudgetStopped) and not stop.tool_only
    assert stop.stop.reason is StopReason.MAX_TOOL_CALLS
    assert (stop.stop.limit, stop.stop.observed, stop.counters.tool_calls) == (3, 4, 3)
    assert engine.observe(tool(query="d")) == ()  # reported once


def test_a_per_tool_cap_stops_that_tool_only() -> None:
    engine = Engine(limits=Limits(tool_caps={"send_email": 1}), clock=Clock())
    (stop,) = engine.observe(tool(name="send_email", query="a"))
    assert isinstance(stop, BudgetStopped) and stop.tool_only and stop.stop.tool == "send_email"
    assert engine.observe(tool(name="search_docs", query="b")) == ()


def test_model_calls_are_metered_once_per_response_and_priced() -> None:
    asked: list[str | None] = []

    def price(model: str | None, provider: str | None, i: int, o: int) -> float | None:
        asked.append(model)
        return 0.006 if model == "known" else None

    engine = Engine(limits=Limits(max_cost_usd=0.01), clock=Clock(), price=price)
    span = ModelSpan(trace_id=1, call=ModelCall(model="known", input_tokens=5, output_tokens=1,
                                                call_id="resp_1"))  # fmt: skip
    assert engine.observe(span) == ()
    assert engine.observe(span) == ()  # the same response reported twice
    engine.observe(ModelSpan(trace_id=1, call=ModelCall(model="unknown")))
    (stop,) = engine.observe(ModelSpan(trace_id=1, call=ModelCall(model="known")))
    assert isinstance(stop, BudgetStopped) and stop.stop.reason is StopReason.MAX_COST
    counters = engine.counters(1)
    assert counters is not None
    assert (counters.steps, counters.input_tokens, counters.unpriced_calls) == (3, 5, 1)
    assert counters.cost_usd == pytest.approx(0.012)
    assert engine.stats.duplicate_model_calls == 1
    # a reported cost is used as is, not priced
    engine.observe(ModelSpan(trace_id=2, call=ModelCall(model="x", cost_usd=0.5)))
    assert "x" not in asked


def test_a_huge_reported_cost_is_counted_without_overflow() -> None:
    engine = Engine(limits=Limits(max_cost_usd=1.0), clock=Clock())
    (stop,) = engine.observe(ModelSpan(trace_id=1, call=ModelCall(cost_usd=1e300)))
    assert isinstance(stop, BudgetStopped) and stop.stop.reason is StopReason.MAX_COST


def test_the_engine_imports_no_opentelemetry() -> None:
    code = (
        "import sys, tripwire.engine, tripwire.spans, tripwire.replay.engine;"
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_call_id_memory_ignores_bytes_straddling_two_entries() -> None:
    import struct

    engine = Engine(clock=Clock())
    engine.observe(tool(call_id="call_0"))
    run = engine._runs[1]
    key = struct.Struct("<q").pack(hash("call_x"))
    run.call_ids = b"\x00" * 4 + key + b"\x00" * 4  # the key's bytes across two entries
    engine.observe(tool(query="x", call_id="call_x"))
    engine.observe(tool(query="x", call_id="call_x"))
    assert (engine.stats.tool_calls, engine.stats.duplicate_calls) == (2, 1)
