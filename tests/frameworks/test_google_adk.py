"""Google ADK ``Agent`` on ADK's ``MockModel``, through ADK's own spans (schema 2 and legacy 1)."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

pytest.importorskip("google.adk")

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tripwire.core.budget import Limits
from tripwire.core.reasons import Verdict
from tripwire.core.signature import ABSENT, signature_of
from tripwire.otel.killswitch import KillFlags
from tripwire.otel.processor import BudgetStop, TripwireSpanProcessor, VerdictChange

from .checks import check_distinct, check_loop
from .harness import (
    ADK_SCHEMAS,
    DISTINCT_CALLS,
    INPUT_TOKENS,
    LOOP_CALLS,
    OUTPUT_TOKENS,
    adk_telemetry,
    map_spans,
    run_adk,
)

pytestmark = pytest.mark.frameworks

ARGS_ATTRIBUTE = {2: "gen_ai.tool.call.arguments", 1: "gcp.vertex.agent.tool_call_args"}
"""Where each ADK schema records a tool call's arguments."""
ROOT_SPAN = {2: "invoke_workflow looper", 1: "invocation"}


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection may leave the process while ADK runs (``MockModel`` needs none)."""

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a connection to {address!r} was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


@pytest.mark.parametrize("schema", ADK_SCHEMAS)
def test_looping_agent(schema: int) -> None:
    spans = run_adk(True, schema=schema)
    # ADK's own spans, from its own tracer, in one trace.
    assert {s.instrumentation_scope.name for s in spans} == {"gcp.vertex.agent"}
    tool_spans = [s for s in spans if s.attributes.get("gen_ai.tool.name")]
    assert [s.name for s in tool_spans] == ["execute_tool search_docs"] * LOOP_CALLS
    # Each schema records the arguments in its own place, and only there.
    for s in tool_spans:
        assert s.attributes[ARGS_ATTRIBUTE[schema]] == '{"query": "refund policy"}'
        assert ARGS_ATTRIBUTE[3 - schema] not in s.attributes
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == ROOT_SPAN[schema]

    mapped = map_spans(spans)
    check_loop(mapped)  # 8 calls, one signature (not name-only); 9 model calls, usage once each
    assert mapped.stats.malformed == 0
    # ADK's call ids, one per call.
    assert [c.call_id for c in mapped.tools] == [f"call_{i}" for i in range(LOOP_CALLS)]
    # The same result each time; ADK wraps it as {"result": ...}.
    assert len({c.result_digest for c in mapped.tools}) == 1
    assert mapped.tools[0].result_digest is not None
    assert all(c.error_type is None for c in mapped.tools)
    # Run boundaries: invoke_agent (both schemas) inside invoke_workflow (schema 2 only).
    assert [r.agent for r in mapped.runs] == ["looper"] * (2 if schema == 2 else 1)


@pytest.mark.parametrize("schema", ADK_SCHEMAS)
def test_distinct_agent(schema: int) -> None:
    mapped = map_spans(run_adk(False, schema=schema))
    check_distinct(mapped)
    assert [c.call_id for c in mapped.tools] == [f"call_{i}" for i in range(DISTINCT_CALLS)]
    assert [c.arguments for c in mapped.tools][:2] == [
        '{"query": "billing"}',
        '{"url": "https://docs.example/faq"}',
    ]
    assert len({c.result_digest for c in mapped.tools}) == DISTINCT_CALLS


def test_legacy_usage_on_call_llm_and_generate_content_is_counted_once() -> None:
    """Schema 1 puts each model call's usage on ``call_llm`` and on its ``generate_content``
    child; schema 2 has no ``call_llm``. Both give one ModelCall per model call."""
    spans = run_adk(True, schema=1)
    call_llm = [s for s in spans if s.name == "call_llm"]
    generate = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "generate_content"]
    assert len(call_llm) == len(generate) == LOOP_CALLS + 1
    by_id = {s.context.span_id: s for s in call_llm}
    assert all(g.parent is not None and g.parent.span_id in by_id for g in generate)
    for s in call_llm + generate:
        assert s.attributes["gen_ai.usage.input_tokens"] == INPUT_TOKENS
        assert s.attributes["gen_ai.usage.output_tokens"] == OUTPUT_TOKENS
    mapped = map_spans(spans)
    assert sum(m.input_tokens for m in mapped.models) == (LOOP_CALLS + 1) * INPUT_TOKENS
    assert {m.model for m in mapped.models} == {"mock"}

    assert [s for s in run_adk(True, schema=2) if s.name == "call_llm"] == []


@pytest.mark.parametrize("schema", ADK_SCHEMAS)
def test_budget_counts_each_model_call_once(schema: int) -> None:
    """Through the processor: a token budget of exactly 13 model calls is reached at the 13th
    (the final answer), not earlier, as it would be if ``call_llm`` were counted too."""
    total = (DISTINCT_CALLS + 1) * (INPUT_TOKENS + OUTPUT_TOKENS)
    stops: list[BudgetStop] = []
    provider = TracerProvider()
    processor = TripwireSpanProcessor(
        limits=Limits(max_total_tokens=total),
        on_budget=stops.append,
        flags=KillFlags(),
        prices=None,
    )
    provider.add_span_processor(processor)
    run_adk(False, schema=schema, provider=provider)
    (stop,) = stops
    assert (stop.stop.limit, stop.stop.observed) == (total, total)
    assert stop.counters.steps == DISTINCT_CALLS + 1
    assert stop.counters.tool_calls == DISTINCT_CALLS
    assert processor.stats.internal_errors == 0


@pytest.mark.parametrize("schema", ADK_SCHEMAS)
def test_content_capture_off_gives_name_only_calls(schema: int) -> None:
    """Without ADK's content switches no arguments are recorded: ABSENT, never ``{}``, and
    the looping run is ``uncertain``, not ``stuck``, with a reason naming the switch."""
    spans = run_adk(True, schema=schema, capture=False)
    tool_spans = [s for s in spans if s.attributes.get("gen_ai.tool.name")]
    if schema == 1:  # the legacy schema writes "{}" for both arguments and result
        assert {s.attributes["gcp.vertex.agent.tool_call_args"] for s in tool_spans} == {"{}"}
        assert {s.attributes["gcp.vertex.agent.tool_response"] for s in tool_spans} == {"{}"}
    else:
        assert not any("gen_ai.tool.call.arguments" in s.attributes for s in tool_spans)
    mapped = map_spans(spans)
    assert [c.tool for c in mapped.tools] == ["search_docs"] * LOOP_CALLS
    assert all(c.arguments is ABSENT and c.result_digest is None for c in mapped.tools)
    assert all(signature_of(c.tool, c.arguments).name_only for c in mapped.tools)

    changes: list[VerdictChange] = []
    provider = TracerProvider()
    provider.add_span_processor(TripwireSpanProcessor(on_verdict=changes.append, flags=KillFlags()))
    run_adk(True, schema=schema, capture=False, provider=provider)
    verdicts = {c.assessment.verdict for c in changes}
    assert Verdict.STUCK not in verdicts
    assert Verdict.UNCERTAIN in verdicts
    uncertain = next(c for c in changes if c.assessment.verdict is Verdict.UNCERTAIN)
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in uncertain.assessment.reason


def test_spans_go_to_the_given_provider_only_and_nothing_leaks() -> None:
    """ADK's tracer comes from the global provider: the harness routes it into the test's
    provider for one run and puts everything back (tracer, environment, global provider)."""
    from google.adk.telemetry import tracing

    tracer, global_provider = tracing.tracer, trace_api.get_tracer_provider()
    env = {k: os.environ.get(k) for k in (
        "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        "ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS",
    )}  # fmt: skip
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    p1, p2 = TracerProvider(), TracerProvider()
    p1.add_span_processor(SimpleSpanProcessor(first))
    p2.add_span_processor(SimpleSpanProcessor(second))
    run_adk(True, provider=p1)
    n = len(first.get_finished_spans())
    run_adk(True, schema=1, provider=p2)
    assert n > LOOP_CALLS
    assert len(first.get_finished_spans()) == n  # the second run did not reach the first provider
    assert {s.name for s in second.get_finished_spans()} >= {"invocation", "call_llm"}
    assert tracing.tracer is tracer
    assert trace_api.get_tracer_provider() is global_provider
    assert {k: os.environ.get(k) for k in env} == env
    with (  # one at a time: a second, overlapping use is refused
        adk_telemetry(p1, schema=2, capture=True),
        pytest.raises(RuntimeError, match="already active"),
        adk_telemetry(p2, schema=2, capture=True),
    ):
        pass  # pragma: no cover
    assert tracing.tracer is tracer
