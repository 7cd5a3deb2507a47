"""The processor's and the mapping's fast paths give the results of the general ones.

- the tool-span mapping's one-search path for plain arguments unwraps exactly the envelopes
  the general path does (the mapping itself is tested against real frameworks' spans in
  ``tests/spans``);
- the span processor's key pre-filter drops only spans ``classify`` calls OTHER, and sends
  straight to the tool path only spans it calls TOOL;
- the SDK fast path and the public-API path (duck-typed spans) build the same tool call;
- ``on_start``/``_on_ending`` reach the wrapped processor.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import tripwire.otel as tw
from tripwire.core.events import ToolCall
from tripwire.core.signature import Normalizer, Signature
from tripwire.engine import _engine as engine_module
from tripwire.otel.processor import TripwireSpanProcessor, _role_of
from tripwire.spans.mapping import (
    SpanRole,
    SpanView,
    _tool_call,
    classify,
    map_tool_span,
    view_from_readable_span,
)

SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)

# -- random spans ------------------------------------------------------------------------------

_KEYS = [
    "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.id", "gen_ai.tool.call.result", "tool_arguments", "tool_response",
    "input.value", "output.value", "openinference.span.kind", "traceloop.span.kind",
    "traceloop.entity.name", "traceloop.entity.input", "traceloop.entity.output", "tool.name",
    "gcp.vertex.agent.tool_call_args", "gcp.vertex.agent.tool_response",
    "pydantic_ai.tool.retry.attempt", "pydantic_ai.tool.retry.cause", "error.type",
    "gen_ai.usage.input_tokens", "http.route", "url.path", "db.system",
]  # fmt: skip

_ENVELOPE = json.dumps(
    {"input_str": "{'q': 1}", "tags": [], "metadata": {"langgraph_step": 3},
     "inputs": {"q": 1}, "kwargs": {"tool_call_id": "call_9"}}
)  # fmt: skip
_REORDERED_ENVELOPE = json.dumps(
    {"tags": [], "inputs": {"q": 1}, "input_str": "x", "kwargs": {"tool_call_id": "call_8"}}
)
_SMOLAGENTS = json.dumps({"args": [], "sanitize_inputs_outputs": True, "kwargs": {"q": 1}})
_TOOL_MESSAGE = json.dumps(
    {"type": "tool", "data": {"content": "ok", "tool_call_id": "call_7", "status": "error"}}
)
_ADK_RETRY = json.dumps(
    {"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": "ValueError",
     "retry_count": 2}
)  # fmt: skip

_TEXTS = st.sampled_from(
    [
        "execute_tool", "chat", "invoke_agent", "TOOL", "LLM", "AGENT", "CHAIN", "tool", "llm",
        "agent", "workflow", "{}", "N/A", "<not specified>", "", "search_docs", '{"q": 1}',
        '{"args": [1]}', '{"input_str": "x"}', '{"inputs": 1, "input_str": 2}', "a_b",
        _ENVELOPE, _REORDERED_ENVELOPE, _SMOLAGENTS, _TOOL_MESSAGE, _ADK_RETRY,
        '{"status": "error"}', "not json {",
    ]
)
# Values an SDK span can hold (the SDK drops anything else).
_VALUES = st.one_of(
    _TEXTS,
    st.text(max_size=20),
    st.integers(min_value=-5, max_value=5),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(_TEXTS, max_size=2).map(tuple),
)
_NAMES = st.one_of(
    st.sampled_from(
        ["execute_tool search_docs", "execute_tool ", "search_docs.tool", ".tool", "running tool",
         "toolbox", "tool", "GET /v1/docs", "chat gpt", "invoke_agent looper", "x.workflow", ""]
    ),
    st.text(max_size=20),
)  # fmt: skip
_ATTRS = st.dictionaries(st.sampled_from(_KEYS), _VALUES, max_size=7)


@pytest.mark.parametrize(
    ("arguments", "expected", "call_id"),
    [
        ('{"query": "refund policy"}', '{"query": "refund policy"}', None),  # no underscore
        ('{"user_id": 7}', '{"user_id": 7}', None),  # an underscore, no envelope
        (_ENVELOPE, {"q": 1}, "call_9"),
        (_REORDERED_ENVELOPE, {"q": 1}, "call_8"),
        (_SMOLAGENTS, {"q": 1}, None),
        ('{"args": [1, 2]}', '{"args": [1, 2]}', None),  # the smolagents prefix alone
        ("x" * 5000 + "_" + '"input_str"', "x" * 5000 + "_" + '"input_str"', None),  # one key
    ],
)
def test_tool_call_arguments_unwrap_only_real_envelopes(
    arguments: str, expected: Any, call_id: str | None
) -> None:
    attrs = {"gen_ai.tool.name": "t", "gen_ai.tool.call.arguments": arguments}
    call = _tool_call(attrs, "execute_tool t", None, None, None)
    assert call is not None
    assert (call.arguments, call.call_id) == (expected, call_id)
    view = SpanView(trace_id="0" * 32, span_id="1" * 16, name="execute_tool t", attributes=attrs)
    assert map_tool_span(view) == call


def test_tool_call_failure_argument() -> None:
    attrs = {"gen_ai.tool.name": "t"}
    assert _tool_call(attrs, "x", None, None, None).error_type is None  # type: ignore[union-attr]
    assert _tool_call(attrs, "x", None, None, "").error_type == "error"  # type: ignore[union-attr]
    call = _tool_call(attrs, "x", None, None, "KeyError")
    assert call is not None and call.error_type == "KeyError"
    # an explicit error.type still wins over the status
    call = _tool_call({**attrs, "error.type": "Timeout"}, "x", None, None, "KeyError")
    assert call is not None and call.error_type == "Timeout"


# -- the processor's pre-filter ------------------------------------------------------------------


def _sdk_span(attrs: dict[str, Any], name: Any, root: bool) -> ReadableSpan:
    """An ended span as the SDK hands it to ``on_end`` (its attributes in BoundedAttributes)."""
    parent = None if root else trace_api.SpanContext(0xABC, 0x2, False, SAMPLED)
    return ReadableSpan(
        name=name,
        context=trace_api.SpanContext(0xABC, 0x1, False, SAMPLED),
        parent=parent,
        attributes=BoundedAttributes(attributes=attrs, immutable=True),
        resource=Resource.get_empty(),
        start_time=1_000_000_000,
        end_time=2_000_000_000,
    )


@settings(max_examples=1000, deadline=None)
@given(attrs=_ATTRS, name=_NAMES, root=st.booleans())
def test_the_pre_filter_agrees_with_classify(attrs: dict[str, Any], name: str, root: bool) -> None:
    span = _sdk_span(attrs, name, root)
    sdk_attrs = dict(span.attributes or {})  # what the SDK kept
    assert _role_of(sdk_attrs, name, span.parent) is classify(sdk_attrs, name, None if root else "p")
    processor = TripwireSpanProcessor(flags=tw.KillFlags())
    processor.on_end(span)
    assert processor.stats.internal_errors == 0
    # on_end classifies inline: the span's fate follows classify's role.
    role = classify(sdk_attrs, name, None if root else "p")
    mapped = processor.mapping_stats
    if role is SpanRole.TOOL:
        assert mapped.tool_spans + mapped.malformed == 1
    else:
        assert mapped.tool_spans == mapped.malformed == 0
    if role is not SpanRole.MODEL:
        assert mapped.model_spans == 0


_TOOL_ATTRS = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}


@pytest.mark.parametrize(
    ("attrs", "name", "role"),
    [
        ({"gen_ai.operation.name": "execute_tool"}, "execute_tool t", SpanRole.TOOL),
        ({"gen_ai.operation.name": "chat"}, "chat x", SpanRole.MODEL),
        ({"gen_ai.operation.name": "invoke_agent"}, "a", SpanRole.RUN),
        ({"openinference.span.kind": "TOOL", "tool.name": "t"}, "t", SpanRole.TOOL),
        ({"openinference.span.kind": "LLM"}, "ChatOpenAI", SpanRole.MODEL),
        ({"openinference.span.kind": "AGENT"}, "looper", SpanRole.RUN),
        ({"traceloop.span.kind": "tool"}, "t", SpanRole.TOOL),
        ({"traceloop.span.kind": "llm"}, "openai.chat", SpanRole.MODEL),
        ({"traceloop.span.kind": "workflow"}, "w", SpanRole.RUN),
        ({"gen_ai.tool.name": "t"}, "running", SpanRole.TOOL),
        ({}, "execute_tool t", SpanRole.TOOL),
        ({}, "t.tool", SpanRole.TOOL),
        ({"http.route": "/docs"}, "GET /docs", SpanRole.OTHER),
        ({"http.route": "/tools"}, "GET /tools", SpanRole.OTHER),  # passes, then classify()
    ],
)
def test_every_key_classify_reads_passes_the_pre_filter(
    attrs: dict[str, Any], name: str, role: SpanRole
) -> None:
    processor = TripwireSpanProcessor(flags=tw.KillFlags())
    processor.on_end(_sdk_span(_TOOL_ATTRS, "execute_tool t", root=False))  # the trace is watched
    span = _sdk_span(attrs, name, root=False)
    assert classify(attrs, name, "p") is role
    assert _role_of(attrs, name, span.parent) is role
    processor.on_end(span)
    assert (processor.stats.tool_calls, processor.stats.model_calls, len(processor)) == (
        2 if role is SpanRole.TOOL else 1,
        1 if role is SpanRole.MODEL else 0,
        1,  # a sub-agent's end restarts the loop window; only the root ends the trace's watch
    )
    if role is SpanRole.RUN:
        assert processor.run_state(0xABC) is None  # the window restarted


@pytest.mark.parametrize("name", [12345, None, ("execute_tool x",)])
def test_a_name_that_is_not_a_string_takes_the_general_path(name: Any) -> None:
    processor = TripwireSpanProcessor(flags=tw.KillFlags())
    processor.on_end(_sdk_span({"http.route": "/x"}, name, root=False))
    processor.on_end(_sdk_span({"gen_ai.tool.name": "t"}, name, root=False))
    assert processor.stats.internal_errors == 0
    assert processor.stats.tool_calls == 1  # gen_ai.tool.name alone is a tool span, as before


# -- SDK fast path == public path ----------------------------------------------------------------


def _captured_calls(monkeypatch: pytest.MonkeyPatch) -> list[ToolCall]:
    calls: list[ToolCall] = []
    real = engine_module.evaluate_hashed

    def spy(state: Any, call: ToolCall, *a: Any, **kw: Any) -> Any:
        calls.append(call)
        return real(state, call, *a, **kw)

    monkeypatch.setattr(engine_module, "evaluate_hashed", spy)
    return calls


class _DuckSpan:
    """A span that is not the SDK's: only the public ReadableSpan API."""

    def __init__(self, span: ReadableSpan) -> None:
        self._inner = span

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_sdk_and_public_paths_build_the_same_tool_call(monkeypatch: pytest.MonkeyPatch) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("root"):
        with tracer.start_as_current_span(
            "execute_tool search_docs",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.arguments": '{"query": "refund"}',
            },
        ) as failing:
            failing.record_exception(ValueError("x"))
            failing.set_status(Status(StatusCode.ERROR, "bad"))
        with tracer.start_as_current_span(
            "search_docs.tool",
            attributes={"traceloop.span.kind": "tool", "traceloop.entity.input": _ENVELOPE},
        ):
            pass
        with tracer.start_as_current_span(  # the compiled mapping's case, when it is built
            "execute_tool search_docs",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.id": "call_2",
                "gen_ai.tool.call.arguments": '{"query": "refund", "max_results": 3}',
            },
        ):
            pass
    spans = [s for s in exporter.get_finished_spans() if s.name != "root"]
    calls = _captured_calls(monkeypatch)
    for span in spans:
        TripwireSpanProcessor(flags=tw.KillFlags()).on_end(span)  # SDK fast path
        TripwireSpanProcessor(flags=tw.KillFlags()).on_end(_DuckSpan(span))  # type: ignore[arg-type]
    assert len(calls) == 6
    expected = [map_tool_span(view_from_readable_span(span)) for span in spans]
    assert calls == [expected[0], expected[0], expected[1], expected[1], expected[2], expected[2]]
    assert calls[0].error_type == "ValueError" and calls[0].call_id == "call_1"
    assert calls[2].arguments == {"q": 1} and calls[2].call_id == "call_9"
    assert calls[4].call_id == "call_2" and calls[4].start_s == spans[2].start_time / 1e9
    provider.shutdown()


# -- on_start / _on_ending -----------------------------------------------------------------------


class _Recorder(SpanProcessor):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.events.append(("start", parent_context))

    def _on_ending(self, span: Span) -> None:
        self.events.append(("ending", span.name))

    def on_end(self, span: ReadableSpan) -> None:
        self.events.append(("end", span.name))


def test_on_start_and_on_ending_reach_the_wrapped_processor() -> None:
    inner = _Recorder()
    provider = TracerProvider()
    provider.add_span_processor(TripwireSpanProcessor(inner, flags=tw.KillFlags()))
    ctx = trace_api.set_span_in_context(
        trace_api.NonRecordingSpan(trace_api.SpanContext(0xAB, 0xCD, False, SAMPLED))
    )
    provider.get_tracer("t").start_span("GET /x", context=ctx).end()
    assert [e[0] for e in inner.events] == ["start", "ending", "end"]
    assert inner.events[0][1] is ctx
    provider.shutdown()


def test_an_on_start_of_ones_own_is_forwarded_on_an_sdk_processor() -> None:
    seen: list[str] = []

    class Counting(BatchSpanProcessor):
        def on_start(self, span: Span, parent_context: Context | None = None) -> None:
            seen.append("class")

    patched = BatchSpanProcessor(InMemorySpanExporter())
    patched.on_start = lambda span, parent_context=None: seen.append("instance")  # type: ignore[method-assign]
    for inner in (Counting(InMemorySpanExporter()), patched):
        provider = TracerProvider()
        provider.add_span_processor(TripwireSpanProcessor(inner, flags=tw.KillFlags()))
        provider.get_tracer("t").start_span("a").end()
        provider.shutdown()
    assert seen == ["class", "instance"]


def test_a_subclass_overriding_on_start_keeps_it() -> None:
    seen: list[str] = []

    class Mine(TripwireSpanProcessor):
        def on_start(self, span: Span, parent_context: Context | None = None) -> None:
            seen.append(span.name)
            super().on_start(span, parent_context)

    inner = _Recorder()
    provider = TracerProvider()
    provider.add_span_processor(Mine(inner, flags=tw.KillFlags()))
    provider.get_tracer("t").start_span("a").end()
    assert seen == ["a"]
    assert [e[0] for e in inner.events] == ["start", "ending", "end"]
    provider.shutdown()


def test_standalone_on_start_does_nothing() -> None:
    provider = TracerProvider()
    processor = TripwireSpanProcessor(flags=tw.KillFlags())
    provider.add_span_processor(processor)
    provider.get_tracer("t").start_span("a").end()
    assert processor.stats.internal_errors == 0
    provider.shutdown()


def test_a_normalizer_subclass_computes_the_signatures() -> None:
    """A normalizer subclass that overrides ``signature`` is asked for every tool span."""
    asked: list[str] = []

    class Lowercase(Normalizer):
        def signature(self, tool: str, arguments: Any = None) -> Signature:
            asked.append(tool)
            text = arguments.lower() if isinstance(arguments, str) else arguments
            return super().signature(tool, text)

    processor = TripwireSpanProcessor(normalizer=Lowercase(), flags=tw.KillFlags())
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
    for i, query in enumerate(["Refund", "REFUND", "refund", "rEfund"]):
        span_attrs = {
            **attrs,
            "gen_ai.tool.call.id": f"call_{i}",
            "gen_ai.tool.call.arguments": json.dumps({"q": query}),
        }
        processor.on_end(_sdk_span(span_attrs, "execute_tool t", False))
    assert asked == ["t"] * 4
    verdict = processor.verdict(0xABC)
    assert verdict is not None and verdict.verdict.value == "stuck"  # the four are one call
