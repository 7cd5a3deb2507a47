"""TripwireSpanProcessor on spans made by a real SDK TracerProvider (GenAI conventions)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import tripwire.otel as tw
from tripwire.core.events import ModelCall
from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.errors import ConfigError, LoopDetected
from tripwire.otel.processor import (
    VERDICT_SPAN_NAME,
    TripwireSpanProcessor,
    VerdictChange,
    _attributes_of,
    _SdkSpanView,
)
from tripwire.spans import SpanView, view_from_readable_span

LOOP_ARGS = {"query": "refund policy"}


class Pipeline:
    """A provider with tripwire wrapped around a SimpleSpanProcessor into memory."""

    def __init__(self, **kw: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.changes: list[VerdictChange] = []
        kw.setdefault("on_verdict", self.changes.append)
        kw.setdefault("flags", tw.KillFlags())
        self.processor = TripwireSpanProcessor(SimpleSpanProcessor(self.exporter), **kw)
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("test")

    def tool(
        self, tool: str, args: Any = LOOP_ARGS, *, call_id: str | None = None, **extra: Any
    ) -> None:
        attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
        if args is not None:
            attrs["gen_ai.tool.call.arguments"] = args if isinstance(args, str) else json.dumps(args)
        if call_id is not None:
            attrs["gen_ai.tool.call.id"] = call_id
        attrs.update(extra)
        with self.tracer.start_as_current_span(f"execute_tool {tool}", attributes=attrs):
            pass

    def agent(self, name: str = "looper") -> Any:
        return self.tracer.start_as_current_span(
            f"invoke_agent {name}",
            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name},
        )

    def tripwire_spans(self) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if "tripwire.verdict" in (s.attributes or {})]


@pytest.fixture
def pipe() -> Iterator[Pipeline]:
    p = Pipeline()
    yield p
    p.provider.shutdown()


@pytest.fixture
def global_flags() -> Iterator[tw.KillFlags]:
    tw.KILL_FLAGS.clear_all()
    yield tw.KILL_FLAGS
    tw.KILL_FLAGS.clear_all()


def current_trace() -> int:
    return trace_api.get_current_span().get_span_context().trace_id


# -- detection ----------------------------------------------------------------------------


def test_eight_identical_calls_flagged_at_the_fourth_and_check_refuses_the_next(
    global_flags: tw.KillFlags,
) -> None:
    p = Pipeline(flags=global_flags)
    refused_at = None
    with p.agent():
        for i in range(1, 9):
            try:
                tw.check()
            except LoopDetected as exc:
                refused_at = i
                caught = exc
                break
            p.tool("search_docs", call_id=f"call_{i}")
    assert refused_at == 5  # calls 1-4 ran; the 4th tripped the flag; the 5th step was refused
    assert [(c.assessment.verdict, c.assessment.call_index) for c in p.changes] == [
        (Verdict.STUCK, 4)
    ]
    assert p.changes[0].flagged and p.changes[0].previous is Verdict.WORKING
    assert caught.rule is Rule.REPETITION
    assert (caught.tool, caught.hits, caught.window, caught.period, caught.call_index) == (
        "search_docs", 4, 10, 1, 4,
    )  # fmt: skip
    assert caught.digest == p.changes[0].assessment.digest
    assert p.processor.stats.flags_raised == 1


def test_check_does_not_raise_before_the_fourth_call(global_flags: tw.KillFlags) -> None:
    p = Pipeline(flags=global_flags)
    with p.agent():
        trace_id = current_trace()
        for i in range(3):
            p.tool("search_docs", call_id=f"c{i}")
            tw.check()
            tw.check(trace_id)
            tw.check(f"{trace_id:032x}")
        p.tool("search_docs", call_id="c3")
        with pytest.raises(LoopDetected):
            tw.check()
    # the flag outlives the run's per-trace state (the root span ended)
    assert len(p.processor) == 0
    with pytest.raises(LoopDetected):
        tw.check(trace_id)
    assert tw.clear(trace_id)
    tw.check(trace_id)


def test_twelve_distinct_calls_are_not_flagged(pipe: Pipeline) -> None:
    with pipe.agent():
        trace_id = current_trace()
        for i in range(12):
            tool = "search_docs" if i % 2 else "fetch_page"
            pipe.tool(tool, {"query": f"topic {i}"}, call_id=f"c{i}")
        assert pipe.processor.verdict(trace_id).verdict is Verdict.WORKING  # type: ignore[union-attr]
    assert pipe.changes == []
    assert pipe.processor.flags.get(trace_id) is None
    assert pipe.processor.stats.tool_calls == 12
    assert pipe.tripwire_spans() == []


def test_two_interleaved_traces_are_judged_separately(pipe: Pipeline) -> None:
    """A calls search_docs 4 times, B the same 3 times: together 7 identical calls, but only A loops."""
    tracer = pipe.tracer
    a = tracer.start_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"})
    b = tracer.start_span("invoke_agent b", attributes={"gen_ai.operation.name": "invoke_agent"})
    ctx_a, ctx_b = trace_api.set_span_in_context(a), trace_api.set_span_in_context(b)
    order = [ctx_a, ctx_b, ctx_a, ctx_b, ctx_a, ctx_b, ctx_a]
    for i, ctx in enumerate(order):
        span = tracer.start_span(
            "execute_tool search_docs",
            context=ctx,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.arguments": json.dumps(LOOP_ARGS),
                "gen_ai.tool.call.id": f"c{i}",
            },
        )
        span.end()
    tid_a, tid_b = a.get_span_context().trace_id, b.get_span_context().trace_id
    assert tid_a != tid_b
    assert [c.trace_id for c in pipe.changes] == [f"{tid_a:032x}"]
    assert pipe.changes[0].assessment.call_index == 4
    assert pipe.processor.flags.get(tid_a) is not None
    assert pipe.processor.flags.get(tid_b) is None
    assert pipe.processor.verdict(tid_b).verdict is Verdict.WORKING  # type: ignore[union-attr]
    a.end()
    b.end()
    assert len(pipe.processor) == 0


def test_partial_spans_of_one_call_id_count_once(pipe: Pipeline) -> None:
    with pipe.agent():
        for _ in range(5):  # five partial/streamed reports of one call
            pipe.tool("search_docs", call_id="call_1")
        assert pipe.changes == []
        assert pipe.processor.stats.duplicate_calls == 4
        for i in range(2, 5):  # three more real calls: the 4th identical call trips
            pipe.tool("search_docs", call_id=f"call_{i}")
    assert [(c.assessment.verdict, c.assessment.call_index) for c in pipe.changes] == [
        (Verdict.STUCK, 4)
    ]


def test_spans_without_call_ids_each_count(pipe: Pipeline) -> None:
    with pipe.agent():
        for _ in range(4):
            pipe.tool("search_docs")
    assert [c.assessment.verdict for c in pipe.changes] == [Verdict.STUCK]


def test_name_only_spans_are_uncertain_and_name_the_switch(pipe: Pipeline) -> None:
    with pipe.agent():
        trace_id = current_trace()
        for i in range(6):
            pipe.tool("search_docs", None, call_id=f"c{i}")
    assert [c.assessment.verdict for c in pipe.changes] == [Verdict.UNCERTAIN]
    change = pipe.changes[0]
    assert not change.flagged and not change.assessment.arguments_seen
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in change.assessment.reason
    assert pipe.processor.flags.get(trace_id) is None
    (annotated,) = pipe.tripwire_spans()
    assert annotated.attributes["tripwire.arguments_seen"] == "false"  # type: ignore[index]


def test_tool_key_makes_the_name_decide() -> None:
    p = Pipeline(policy=LoopPolicy(key="tool"))  # type: ignore[arg-type]
    with p.agent():
        for i in range(4):
            p.tool("search_docs", None, call_id=f"c{i}")
    assert [(c.assessment.verdict, c.flagged) for c in p.changes] == [(Verdict.STUCK, True)]


# -- annotations --------------------------------------------------------------------------


def test_annotations_reach_the_exporter_behind_the_processor(pipe: Pipeline) -> None:
    with pipe.agent():
        for i in range(4):
            pipe.tool("search_docs", call_id=f"c{i}", **{"app.marker": i})
    spans = pipe.exporter.get_finished_spans()
    assert [s.name for s in spans] == ["execute_tool search_docs"] * 4 + ["invoke_agent looper"]
    plain, flagged = spans[2], spans[3]
    assert not any(k.startswith("tripwire.") for k in plain.attributes or {})
    attrs = dict(flagged.attributes or {})
    assert attrs["tripwire.verdict"] == "stuck"
    assert attrs["tripwire.rule"] == "repetition"
    assert attrs["tripwire.period"] == 1
    assert attrs["tripwire.call_index"] == 4
    assert "search_docs repeated 4" in str(attrs["tripwire.reason"])
    assert attrs["tripwire.policy_version"] == pipe.processor.policy.version
    assert attrs["tripwire.mapping_version"] == tw.MAPPING_VERSION
    # the original span survives intact in the copy
    assert attrs["app.marker"] == 3 and attrs["gen_ai.tool.name"] == "search_docs"
    assert flagged.context.trace_id == plain.context.trace_id
    assert flagged.context.span_id != plain.context.span_id
    assert flagged.parent is not None and flagged.parent.span_id == spans[4].context.span_id
    assert flagged.end_time is not None and flagged.start_time is not None
    assert flagged.instrumentation_scope is not None and flagged.instrumentation_scope.name == "test"


def test_the_original_span_is_not_mutated() -> None:
    seen: list[ReadableSpan] = []

    class Before(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            seen.append(span)

    p = Pipeline()
    p.provider.add_span_processor(Before())  # beside tripwire: sees the span tripwire got
    with p.agent():
        for i in range(4):
            p.tool("search_docs", call_id=f"c{i}")
    assert "tripwire.verdict" not in (seen[3].attributes or {})
    assert "tripwire.verdict" in (p.exporter.get_finished_spans()[3].attributes or {})


def test_events_status_and_dropped_count_carry_over() -> None:
    p = Pipeline()
    with p.agent():
        for i in range(4):
            with p.tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    "gen_ai.tool.call.arguments": json.dumps(LOOP_ARGS),
                    "gen_ai.tool.call.id": f"c{i}",
                },
            ) as span:
                span.add_event("progress", {"n": i})
                span.set_status(Status(StatusCode.OK))
    flagged = p.exporter.get_finished_spans()[3]
    assert flagged.attributes["tripwire.verdict"] == "stuck"  # type: ignore[index]
    assert [e.name for e in flagged.events] == ["progress"]
    assert flagged.status.status_code is StatusCode.OK
    assert flagged.dropped_attributes == 0


def test_standalone_processor_emits_a_verdict_span_through_a_tracer() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # the user's own processor
    processor = TripwireSpanProcessor(flags=tw.KillFlags(), tracer=provider.get_tracer("tripwire"))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for i in range(4):
            with tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    "gen_ai.tool.call.arguments": json.dumps(LOOP_ARGS),
                    "gen_ai.tool.call.id": f"c{i}",
                },
            ):
                pass
    spans = exporter.get_finished_spans()
    verdicts = [s for s in spans if s.name == VERDICT_SPAN_NAME]
    assert len(verdicts) == 1
    (verdict,) = verdicts
    tool4 = [s for s in spans if s.name == "execute_tool search_docs"][3]
    assert verdict.parent is not None and verdict.parent.span_id == tool4.context.span_id
    assert verdict.context.trace_id == tool4.context.trace_id
    assert verdict.attributes["tripwire.verdict"] == "stuck"  # type: ignore[index]
    assert processor.stats.internal_errors == 0
    provider.shutdown()


# -- the boundary -------------------------------------------------------------------------


def test_callback_exceptions_do_not_escape_and_are_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[VerdictChange] = []

    def broken(change: VerdictChange) -> None:
        raise RuntimeError("callback bug")

    p = Pipeline(on_verdict=[broken, calls.append])
    with caplog.at_level(logging.WARNING, logger="tripwire.otel"), p.agent():
        for i in range(4):
            p.tool("search_docs", call_id=f"c{i}")  # no exception out of span.end()
        for i in range(12):  # a whole window of distinct calls: the verdict changes back
            p.tool("fetch_page", {"page": i}, call_id=f"d{i}")
    assert [c.assessment.verdict for c in calls] == [Verdict.STUCK, Verdict.WORKING]
    assert p.processor.stats.callback_errors == 2
    assert len([r for r in caplog.records if "callback" in r.getMessage()]) == 1
    assert len(p.tripwire_spans()) == 2  # annotations still happened


class _Hostile:
    """A duck-typed span whose every property is wrong or raises."""

    name = 12345
    parent = None

    @property
    def attributes(self) -> Any:
        raise RuntimeError("boom")

    @property
    def context(self) -> Any:
        raise RuntimeError("boom")


def _raw_span(attributes: dict[str, Any], trace_id: int = 0xABC, name: str = "execute_tool x") -> ReadableSpan:
    ctx = trace_api.SpanContext(trace_id, 0x1, False, trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED))
    parent = trace_api.SpanContext(trace_id, 0x2, False)
    return ReadableSpan(
        name=name,
        context=ctx,
        parent=parent,
        attributes=attributes,  # a plain dict: no SDK validation of the values
        resource=Resource.get_empty(),
        start_time=1,
        end_time=2,
    )


@pytest.mark.parametrize(
    "attributes",
    [
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": 123},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": ["a", "b"]},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.arguments": 7},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.arguments": "{" * 100_000},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.arguments": "x" * 3_000_000},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.id": 5},
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.arguments": "\udcff"},
        {"gen_ai.operation.name": object(), "openinference.span.kind": ["TOOL"]},
        {"openinference.span.kind": "TOOL", "input.value": b"\xff\x00", "tool.name": "t"},
        {"traceloop.span.kind": 3},
        {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": "lots"},
    ],
)
def test_hostile_spans_never_raise_out_of_on_end(attributes: dict[str, Any]) -> None:
    exporter = InMemorySpanExporter()
    processor = TripwireSpanProcessor(SimpleSpanProcessor(exporter), flags=tw.KillFlags())
    for _ in range(5):
        processor.on_end(_raw_span(attributes))
    assert len(exporter.get_finished_spans()) == 5  # the wrapped processor saw every span


def test_an_exception_inside_the_processor_is_counted_and_the_span_still_passes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[Any] = []

    class Inner(SpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            received.append(span)

    processor = TripwireSpanProcessor(Inner(), flags=tw.KillFlags())
    hostile = _Hostile()
    with caplog.at_level(logging.WARNING, logger="tripwire.otel"):
        processor.on_end(hostile)  # type: ignore[arg-type]
        processor.on_end(hostile)  # type: ignore[arg-type]
    assert received == [hostile, hostile]
    assert processor.stats.internal_errors == 2
    assert len(caplog.records) == 1


def test_a_broken_normalizer_is_contained(pipe: Pipeline) -> None:
    class Broken:
        version = "broken"

        def signature(self, *a: Any) -> Any:
            raise RuntimeError("bug")

        def digest(self, *a: Any) -> str:
            return "0"

    p = Pipeline(normalizer=Broken())
    with p.agent():
        p.tool("search_docs", call_id="c1")
    assert p.processor.stats.internal_errors == 1
    assert len(p.exporter.get_finished_spans()) == 2


# -- lifecycle ----------------------------------------------------------------------------


def test_shutdown_is_idempotent_and_force_flush_delegates() -> None:
    calls: list[str] = []

    class Inner(SpanProcessor):
        def shutdown(self) -> None:
            calls.append("shutdown")

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            calls.append(f"flush {timeout_millis}")
            return False

    processor = TripwireSpanProcessor(Inner(), flags=tw.KillFlags())
    assert processor.force_flush(1234) is False
    processor.shutdown()
    processor.shutdown()
    assert calls == ["flush 1234", "shutdown"]
    assert TripwireSpanProcessor(flags=tw.KillFlags()).force_flush() is True


def test_after_shutdown_spans_pass_through_unjudged(pipe: Pipeline) -> None:
    pipe.processor.shutdown()
    pipe.processor.on_end(_raw_span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}))
    assert pipe.processor.stats.tool_calls == 0


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"max_traces": 0}, "max_traces"),
        ({"max_traces": True}, "max_traces"),
        ({"idle_ttl_s": -1}, "idle_ttl_s"),
        ({"idle_ttl_s": "soon"}, "idle_ttl_s"),
        ({"policy": {"window": 3}}, "policy"),
    ],
)
def test_bad_settings_raise_config_error(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        TripwireSpanProcessor(**kw)
    assert info.value.field == field


# -- model spans and the fast paths -------------------------------------------------------


def test_model_spans_reach_the_budget_hook_once_each() -> None:
    seen: list[tuple[int, ModelCall]] = []

    class WithBudget(TripwireSpanProcessor):
        def observe_model_call(self, trace_id: int, call: ModelCall) -> None:
            seen.append((trace_id, call))

    provider = TracerProvider()
    processor = WithBudget(flags=tw.KillFlags())
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for _ in range(2):
            with tracer.start_as_current_span(
                "chat gpt",
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-x",
                    "gen_ai.usage.input_tokens": 10,
                    "gen_ai.usage.output_tokens": 3,
                },
            ):
                pass
    assert [(c.input_tokens, c.output_tokens, c.model) for _, c in seen] == [(10, 3, "gpt-x")] * 2
    assert processor.stats.model_calls == 2


def test_fast_attributes_match_public(pipe: Pipeline) -> None:
    with pipe.agent():
        pipe.tool("search_docs", call_id="c1", **{"app.n": 3})
    span = pipe.exporter.get_finished_spans()[0]
    fast = _attributes_of(span)
    assert type(fast) is dict  # the fast path is in use with this SDK version
    assert fast == dict(span.attributes or {})


def test_sdk_view_matches_view_from_readable_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope-x")
    with (
        tracer.start_as_current_span("root"),
        tracer.start_as_current_span("execute_tool t", attributes={"gen_ai.tool.name": "t"}) as s,
    ):
        s.record_exception(ValueError("x"))
        s.set_status(Status(StatusCode.ERROR, "bad"))
    for span in exporter.get_finished_spans():
        reference = view_from_readable_span(span)
        fast = _SdkSpanView(span, _attributes_of(span))
        for f in fields(SpanView):
            assert getattr(fast, f.name) == getattr(reference, f.name), f.name
