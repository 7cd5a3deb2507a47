"""Budgets in TripwireSpanProcessor, on spans made by a real SDK TracerProvider.

Semantics under test (spans arrive after the work they record):

- count caps (``max_tool_calls``, ``max_steps``, per-tool caps) are *reached* when the n-th
  call ends: the flag goes up then, and the runtime's next ``check()`` refuses call n+1.
  ``observed`` is what the counter would become with that refused call (n+1), as in the Guard;
- tokens, cost and time stop the run once their total is ``>=`` the limit; ``observed`` is the
  total;
- a per-tool cap raises a *tool flag*: ``check(tool=that_tool)`` raises, plain ``check()``
  does not (the run may go on without that tool);
- each flag is raised once per run; a loop flag takes precedence over a budget flag.
"""

from __future__ import annotations

import json
import logging
import math
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tripwire
import tripwire.otel as tw
from tripwire.core.budget import Limits
from tripwire.core.reasons import StopReason
from tripwire.errors import BudgetExceeded, ConfigError, LoopDetected
from tripwire.otel.processor import BUDGET_SPAN_NAME, BudgetStop, TripwireSpanProcessor

T0 = 1_700_000_000 * 10**9  # span times in ns since the epoch
SEC = 10**9


class Pipeline:
    """A provider with tripwire (with limits) wrapped around a SimpleSpanProcessor into memory."""

    def __init__(self, limits: Limits | None, *, wrap: bool = True, **kw: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.stops: list[BudgetStop] = []
        kw.setdefault("on_budget", self.stops.append)
        kw.setdefault("flags", tw.KillFlags())
        self.provider = TracerProvider()
        self.tracer = self.provider.get_tracer("test")
        if wrap:
            self.processor = TripwireSpanProcessor(
                SimpleSpanProcessor(self.exporter), limits=limits, **kw
            )
            self.provider.add_span_processor(self.processor)
        else:
            self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
            self.processor = TripwireSpanProcessor(limits=limits, tracer=self.tracer, **kw)
            self.provider.add_span_processor(self.processor)
        self.flags: tw.KillFlags = kw["flags"]
        self._n = 0

    def agent(self, name: str = "agent") -> Any:
        return self.tracer.start_as_current_span(
            f"invoke_agent {name}",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
        )

    def tool(
        self, tool: str = "search_docs", args: Any = None, *, start: int | None = None,
        end: int | None = None,
    ) -> None:  # fmt: skip
        self._n += 1
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "gen_ai.tool.call.id": f"call_{self._n}",
            "gen_ai.tool.call.arguments": json.dumps(args if args is not None else {"n": self._n}),
        }
        span = self.tracer.start_span(f"execute_tool {tool}", attributes=attrs, start_time=start)
        span.end(end_time=end)

    def chat(
        self, input_tokens: Any = 0, output_tokens: Any = 0, *, model: str = "gpt-4o",
        response_id: str | None = None, start: int | None = None, end: int | None = None,
        **extra: Any,
    ) -> None:  # fmt: skip
        self._n += 1
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.provider.name": "openai",
            "gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": output_tokens,
            "gen_ai.response.id": response_id or f"resp_{self._n}",
            **extra,
        }
        span = self.tracer.start_span(f"chat {model}", attributes=attrs, start_time=start)
        span.end(end_time=end)

    def annotated(self) -> list[ReadableSpan]:
        return [
            s for s in self.exporter.get_finished_spans()
            if "tripwire.stop_reason" in (s.attributes or {})
        ]  # fmt: skip


@pytest.fixture
def global_flags() -> Iterator[tw.KillFlags]:
    tw.KILL_FLAGS.clear_all()
    yield tw.KILL_FLAGS
    tw.KILL_FLAGS.clear_all()


def trace_of(span: Any) -> int:
    return int(span.get_span_context().trace_id)


def budget_error(flags: tw.KillFlags, tid: int, tool: str | None = None) -> BudgetExceeded:
    with pytest.raises(BudgetExceeded) as info:
        flags.check(tid, tool=tool)
    return info.value


# -- tool calls -------------------------------------------------------------------------------


def test_max_tool_calls_is_reached_when_the_nth_call_ends(global_flags: tw.KillFlags) -> None:
    p = Pipeline(Limits(max_tool_calls=3), flags=global_flags)
    passed = []
    with p.agent():
        for _ in range(3):
            tripwire.check()  # the top-level re-export reads the current span's trace
            passed.append(p.processor.counters(trace_api.get_current_span().get_span_context().trace_id))
            p.tool()
        with pytest.raises(BudgetExceeded) as info:
            tripwire.check()
    # checks before calls 1, 2 and 3 passed (0, 1 and 2 calls made: limit-1 included)
    assert [c.tool_calls if c else 0 for c in passed] == [0, 1, 2]
    exc = info.value
    assert exc.reason is StopReason.MAX_TOOL_CALLS
    assert (exc.limit_name, exc.limit, exc.observed) == ("max_tool_calls", 3, 4)
    assert exc.counters.tool_calls == 3
    assert pickle.loads(pickle.dumps(exc)).limit_name == "max_tool_calls"
    assert p.processor.stats.budget_stops == 1


def test_limit_minus_one_limit_and_limit_plus_one() -> None:
    p = Pipeline(Limits(max_tool_calls=3))
    with p.agent() as run:
        tid = trace_of(run)
        p.tool()
        p.tool()
        p.flags.check(tid)  # limit-1: passes
        assert p.stops == []
        p.tool()  # limit: reached
        assert budget_error(p.flags, tid).observed == 4
        p.tool()  # limit+1 (the runtime did not check): still stopped, raised once
        exc = budget_error(p.flags, tid)
        counters = p.processor.counters(tid)
    assert exc.observed == 4 and exc.counters.tool_calls == 3
    assert counters is not None and counters.tool_calls == 4
    assert len(p.stops) == 1 and p.stops[0].stop.reason is StopReason.MAX_TOOL_CALLS
    assert p.stops[0].flagged and not p.stops[0].tool_only


def test_the_stop_is_annotated_on_the_span_that_reached_it() -> None:
    p = Pipeline(Limits(max_tool_calls=2))
    with p.agent():
        p.tool()
        p.tool()
    [span] = p.annotated()
    attrs = dict(span.attributes or {})
    assert span.name == "execute_tool search_docs"
    assert attrs["gen_ai.tool.call.id"] == "call_2"
    assert attrs["tripwire.stop_reason"] == "max_tool_calls"
    assert attrs["tripwire.limit_name"] == "max_tool_calls"
    assert (attrs["tripwire.limit"], attrs["tripwire.observed"]) == (2, 3)


def test_standing_alone_a_budget_child_span_is_emitted() -> None:
    p = Pipeline(Limits(max_tool_calls=1), wrap=False)
    with p.agent() as run:
        p.tool()
        tid = trace_of(run)
    [child] = [s for s in p.exporter.get_finished_spans() if s.name == BUDGET_SPAN_NAME]
    assert child.context.trace_id == tid
    assert (child.attributes or {})["tripwire.stop_reason"] == "max_tool_calls"


def test_a_per_tool_cap_refuses_that_tool_only() -> None:
    p = Pipeline(Limits(tool_caps={"send_email": 1}, default_tool_cap=2))
    with p.agent() as run:
        tid = trace_of(run)
        p.tool("send_email")
        p.flags.check(tid)  # the run goes on
        p.flags.check(tid, tool="search_docs")
        exc = budget_error(p.flags, tid, tool="send_email")
        p.tool("search_docs")
        p.flags.check(tid, tool="search_docs")  # 1 of 2: limit-1
        p.tool("search_docs")
        search = budget_error(p.flags, tid, tool="search_docs")
        p.flags.check(tid)
    assert exc.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL
    assert (exc.limit_name, exc.limit, exc.observed) == ("tool_caps['send_email']", 1, 2)
    assert (search.limit_name, search.limit, search.observed) == ("default_tool_cap", 2, 3)
    assert [(s.stop.tool, s.tool_only) for s in p.stops] == [
        ("send_email", True), ("search_docs", True),
    ]  # fmt: skip
    assert set(p.flags.tool_flags(tid)) == {"send_email", "search_docs"}
    assert p.flags.clear(tid) and p.flags.tool_flags(tid) == {}


def test_only_capped_tools_are_counted_per_tool() -> None:
    p = Pipeline(Limits(tool_caps={"send_email": 1}))
    with p.agent() as run:
        tid = trace_of(run)
        for _ in range(5):
            p.tool("search_docs")
        counters = p.processor.counters(tid)
        p.flags.check(tid, tool="search_docs")
    assert counters is not None
    assert counters.tool_calls == 5 and dict(counters.tool_calls_by_tool) == {}


# -- model calls: steps, tokens, cost ----------------------------------------------------------


def test_max_steps_counts_model_spans() -> None:
    p = Pipeline(Limits(max_steps=2))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat(10, 10)
        p.flags.check(tid)
        p.chat(10, 10)
        exc = budget_error(p.flags, tid)
    assert exc.reason is StopReason.MAX_STEPS
    assert (exc.limit, exc.observed) == (2, 3)


def test_tokens_from_chat_spans_count_once_and_stop_at_the_limit() -> None:
    p = Pipeline(Limits(max_total_tokens=1000))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat(300, 200, response_id="r1")
        p.chat(300, 200, response_id="r1")  # a second (streamed) span of the same call
        with p.agent("sub-agent"):  # a run span carrying usage is not a model call
            trace_api.get_current_span().set_attribute("gen_ai.usage.input_tokens", 10_000)
        p.chat(400, 99)  # 999: limit-1
        p.flags.check(tid)
        before = p.processor.counters(tid)
        p.chat(1, 0)  # 1000: the limit
        exc = budget_error(p.flags, tid)
    assert before is not None and before.total_tokens == 999 and before.steps == 2
    assert p.processor.stats.duplicate_model_calls == 1
    assert exc.reason is StopReason.MAX_TOTAL_TOKENS
    assert (exc.limit, exc.observed) == (1000, 1000)


def test_tokens_over_the_limit_report_the_total() -> None:
    p = Pipeline(Limits(max_total_tokens=1000))
    with p.agent() as run:
        p.chat(900, 101)
        exc = budget_error(p.flags, trace_of(run))
    assert (exc.limit, exc.observed) == (1000, 1001)


def test_cost_from_the_price_table_stops_when_it_crosses_the_limit() -> None:
    # gpt-4o in genai-prices: $2.50 per million input tokens, $10 per million output tokens,
    # so 1000 in + 500 out = 0.0025 + 0.0050 = $0.0075 per call.
    p = Pipeline(Limits(max_cost_usd=0.02))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat(1000, 500)
        first = p.processor.counters(tid)
        p.chat(1000, 500)  # $0.015
        p.flags.check(tid)
        p.chat(1000, 500)  # $0.0225 >= $0.02
        exc = budget_error(p.flags, tid)
    assert first is not None and first.cost_usd > 0
    assert first.cost_usd == pytest.approx(0.0075)
    assert exc.reason is StopReason.MAX_COST
    assert exc.limit == 0.02 and exc.observed == pytest.approx(0.0225)
    assert p.processor.stats.unpriced_calls == 0


def test_a_cost_reported_on_the_span_wins_over_the_table() -> None:
    p = Pipeline(Limits(max_cost_usd=0.5))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat(1, 1, **{"operation.cost": 0.3})
        p.flags.check(tid)
        p.chat(1, 1, **{"llm.cost.total": 0.25})
        exc = budget_error(p.flags, tid)
    assert exc.observed == pytest.approx(0.55)


def test_an_unknown_model_warns_once_and_never_stops_on_cost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = Pipeline(Limits(max_cost_usd=0.000001))
    with caplog.at_level(logging.WARNING, logger="tripwire.otel"), p.agent() as run:
        tid = trace_of(run)
        for _ in range(3):
            p.chat(100_000, 100_000, model="no-such-model-xyz")
        p.flags.check(tid)
        counters = p.processor.counters(tid)
    warned = [r for r in caplog.records if "no-such-model-xyz" in r.getMessage()]
    assert len(warned) == 1
    assert counters is not None and counters.cost_usd == 0 and counters.unpriced_calls == 3
    assert p.processor.stats.unpriced_calls == 3 and p.stops == []


def test_hostile_usage_and_cost_attributes_degrade() -> None:
    p = Pipeline(Limits(max_cost_usd=1.0, max_total_tokens=10**6))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat("lots", 500, **{"operation.cost": float("nan")})
        p.chat(1000, 500, **{"operation.cost": "free"})
        counters = p.processor.counters(tid)
    assert p.processor.stats.internal_errors == 0
    assert p.processor.stats.usage_errors == 3  # the token, and two cost attributes
    assert counters is not None
    assert (counters.input_tokens, counters.output_tokens) == (1000, 1000)
    # unusable costs fall back to the table: 500 out + (1000 in, 500 out) of gpt-4o
    assert counters.cost_usd == pytest.approx(0.005 + 0.0075)


def test_a_broken_price_lookup_never_reaches_span_end(caplog: pytest.LogCaptureFixture) -> None:
    def broken(model: str, provider: str | None, i: int, o: int) -> float | None:
        raise RuntimeError("price table exploded")

    p = Pipeline(Limits(max_cost_usd=0.01), prices=broken)
    with caplog.at_level(logging.WARNING, logger="tripwire.prices"), p.agent() as run:
        p.chat(10, 10)
        p.chat(10, 10)
        p.flags.check(trace_of(run))
    stats = p.processor.stats
    assert (stats.internal_errors, stats.unpriced_calls) == (0, 2)
    failed = [r for r in caplog.records if "failed (RuntimeError)" in r.getMessage()]
    assert len(failed) == 1  # logged once, through the one Pricer
    assert "exploded" not in failed[0].getMessage()  # the price table's text is not repeated


def test_prices_returning_nonsense_are_not_counted() -> None:
    p = Pipeline(Limits(max_cost_usd=0.01), prices=lambda *a: math.inf)
    with p.agent() as run:
        p.chat(10, 10)
        p.flags.check(trace_of(run))
    assert p.processor.stats.unpriced_calls == 1  # an unusable price leaves the call unpriced


# -- time ----------------------------------------------------------------------------------------


def test_duration_runs_from_the_first_span_start() -> None:
    p = Pipeline(Limits(max_duration_s=10))
    with p.agent() as run:
        tid = trace_of(run)
        p.chat(1, 1, start=T0, end=T0 + 2 * SEC)
        # 9.999999 s: limit-1 at the resolution of span times as seconds since the epoch
        p.tool(start=T0 + 3 * SEC, end=T0 + 10 * SEC - 1000)
        p.flags.check(tid)
        p.tool(start=T0 + 4 * SEC, end=T0 + 10 * SEC)  # 10 s: the limit
        exc = budget_error(p.flags, tid)
    assert exc.reason is StopReason.MAX_DURATION
    assert (exc.limit, exc.observed) == (10, 10.0)


# -- runs ------------------------------------------------------------------------------------


def test_two_traces_are_counted_separately() -> None:
    p = Pipeline(Limits(max_tool_calls=2))
    with p.agent() as a:
        ta = trace_of(a)
        p.tool()
    with p.agent() as b:
        tb = trace_of(b)
        p.tool()
    # each trace made one call; the root spans ended, so let a third trace run to its cap
    p.flags.check(ta)
    p.flags.check(tb)
    with p.agent() as c:
        tc = trace_of(c)
        p.tool()
        with p.agent("other"):
            pass
        p.tool()
    budget_error(p.flags, tc)
    p.flags.check(ta)
    p.flags.check(tb)
    assert [s.trace_id for s in p.stops] == [f"{tc:032x}"]


def test_interleaved_traces_do_not_share_counters() -> None:
    p = Pipeline(Limits(max_tool_calls=2))
    ctx_a = trace_api.set_span_in_context(trace_api.NonRecordingSpan(trace_api.SpanContext(
        0xA, 1, is_remote=False, trace_flags=trace_api.TraceFlags(1))))  # fmt: skip
    ctx_b = trace_api.set_span_in_context(trace_api.NonRecordingSpan(trace_api.SpanContext(
        0xB, 1, is_remote=False, trace_flags=trace_api.TraceFlags(1))))  # fmt: skip
    for ctx in (ctx_a, ctx_b, ctx_a):
        p.tracer.start_span(
            "execute_tool t", context=ctx,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"},
        ).end()  # fmt: skip
    budget_error(p.flags, 0xA)
    p.flags.check(0xB)
    counters = p.processor.counters(0xB)
    assert counters is not None and counters.tool_calls == 1


def test_a_budget_flag_does_not_mask_a_later_loop_flag() -> None:
    p = Pipeline(Limits(max_tool_calls=3))
    with p.agent() as run:
        tid = trace_of(run)
        for _ in range(3):
            p.tool(args={"query": "refund policy"})
        budget_error(p.flags, tid)
        p.tool(args={"query": "refund policy"})  # the 4th identical call: stuck
        with pytest.raises(LoopDetected) as info:
            p.flags.check(tid)
    assert info.value.call_index == 4
    flag = p.flags.get(tid)
    assert flag is not None and flag.is_loop and flag.reason is StopReason.LOOP_DETECTED


def test_a_loop_flag_is_not_replaced_by_a_later_budget_stop() -> None:
    p = Pipeline(Limits(max_tool_calls=5))
    with p.agent() as run:
        tid = trace_of(run)
        for _ in range(5):
            p.tool(args={"query": "refund policy"})
        with pytest.raises(LoopDetected):
            p.flags.check(tid)
    assert len(p.stops) == 1 and not p.stops[0].flagged
    assert p.processor.stats.flags_raised == 1 and p.processor.stats.budget_stops == 1


def test_a_cleared_budget_flag_is_not_raised_again_for_that_run() -> None:
    p = Pipeline(Limits(max_tool_calls=1))
    with p.agent() as run:
        tid = trace_of(run)
        p.tool()
        assert p.flags.clear(tid)
        p.tool()
        p.flags.check(tid)
    assert len(p.stops) == 1


def test_budget_state_survives_a_sub_agent_and_is_dropped_at_the_root() -> None:
    p = Pipeline(Limits(max_tool_calls=3))
    with p.agent() as run:
        tid = trace_of(run)
        with p.agent("sub-agent"):
            p.tool()
            p.tool()
        counters = p.processor.counters(tid)
        assert p.processor.run_state(tid) is None  # the loop watcher restarted
    assert counters is not None and counters.tool_calls == 2
    assert p.processor.counters(tid) is None and len(p.processor) == 0


def test_model_only_traces_are_bounded_by_the_lru_cap() -> None:
    p = Pipeline(Limits(max_total_tokens=10**6), max_traces=2)
    for tid in (1, 2, 3):
        ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(trace_api.SpanContext(
            tid, 1, is_remote=False, trace_flags=trace_api.TraceFlags(1))))  # fmt: skip
        p.tracer.start_span("chat m", context=ctx, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 5,
        }).end()  # fmt: skip
    assert len(p.processor) == 2 and p.processor.stats.evicted_lru == 1
    assert p.processor.counters(1) is None
    counters = p.processor.counters(3)
    assert counters is not None and counters.input_tokens == 5


def test_without_limits_model_spans_keep_no_state() -> None:
    p = Pipeline(None)
    ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(trace_api.SpanContext(
        7, 1, is_remote=False, trace_flags=trace_api.TraceFlags(1))))  # fmt: skip
    p.tracer.start_span("chat m", context=ctx, attributes={
        "gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 5,
    }).end()  # fmt: skip
    assert len(p.processor) == 0 and p.processor.counters(7) is None
    assert p.processor.stats.model_calls == 1


def test_a_failing_budget_callback_is_counted_and_the_flag_still_rises() -> None:
    def broken(event: BudgetStop) -> None:
        raise RuntimeError("callback bug")

    p = Pipeline(Limits(max_tool_calls=1), on_budget=broken)
    with p.agent() as run:
        p.tool()
        budget_error(p.flags, trace_of(run))
    assert p.processor.stats.callback_errors == 1 and p.processor.stats.internal_errors == 0


def test_limits_the_processor_cannot_enforce_warn_at_construction() -> None:
    with pytest.warns(UserWarning) as record:
        TripwireSpanProcessor(limits=Limits(max_duplicate_calls=2, max_subagents=1))
    text = str(record[0].message)
    assert "max_duplicate_calls" in text and "max_subagents" in text


def test_limits_must_be_a_limits() -> None:
    with pytest.raises(ConfigError) as info:
        TripwireSpanProcessor(limits={"max_tool_calls": 3})  # type: ignore[arg-type]
    assert info.value.field == "limits"


# -- the kill flag value -------------------------------------------------------------------------


def test_a_kill_flag_holds_exactly_one_cause() -> None:
    with pytest.raises(ConfigError):
        tw.KillFlag(1, None, 0.0)


# -- setup ---------------------------------------------------------------------------------------


def _instrument(env: dict[str, str], **kw: Any) -> TripwireSpanProcessor:
    return tw.instrument(provider=TracerProvider(), env=env, flags=tw.KillFlags(), **kw)


def test_instrument_reads_the_budget_variables() -> None:
    p = _instrument({
        "TRIPWIRE_MAX_TOOL_CALLS": "3", "TRIPWIRE_MAX_TOTAL_TOKENS": "5000",
        "TRIPWIRE_MAX_COST_USD": "0.25",
    })  # fmt: skip
    assert p.limits is not None
    assert (p.limits.max_tool_calls, p.limits.max_total_tokens, p.limits.max_cost_usd) == (
        3, 5000, 0.25,
    )  # fmt: skip
    assert _instrument({}).limits is None
    assert _instrument({"TRIPWIRE_MAX_COST_USD": "off"}).limits is None


def test_code_wins_over_the_budget_variables() -> None:
    p = _instrument(
        {"TRIPWIRE_MAX_TOOL_CALLS": "3", "TRIPWIRE_MAX_COST_USD": "0.25"},
        limits=Limits(max_tool_calls=7, max_steps=4),
    )
    assert p.limits is not None
    assert (p.limits.max_tool_calls, p.limits.max_steps, p.limits.max_cost_usd) == (7, 4, 0.25)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("TRIPWIRE_MAX_TOOL_CALLS", "three"),
        ("TRIPWIRE_MAX_TOOL_CALLS", "-1"),
        ("TRIPWIRE_MAX_TOTAL_TOKENS", "0"),
        ("TRIPWIRE_MAX_TOTAL_TOKENS", "1.5"),
        ("TRIPWIRE_MAX_COST_USD", "-0.5"),
        ("TRIPWIRE_MAX_COST_USD", "nan"),
        ("TRIPWIRE_MAX_COST_USD", "cheap"),
    ],
)
def test_a_bad_budget_variable_is_named(var: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        _instrument({var: value})
    assert info.value.field == var and info.value.value == value
