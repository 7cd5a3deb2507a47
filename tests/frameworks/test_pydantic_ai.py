"""pydantic-ai on FunctionModel, through its own instrumentation (GenAI format 5 and legacy 2)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic_ai")

from tripwire.core.signature import signature_of

from .checks import check_distinct, check_loop
from .harness import LOOP_CALLS, map_spans, run_pydantic_ai

pytestmark = pytest.mark.frameworks


@pytest.mark.parametrize("version", [5, 2])
def test_looping_agent(version: int) -> None:
    spans = run_pydantic_ai(True, version=version)
    expected_name = "execute_tool search_docs" if version >= 3 else "running tool"
    assert [s.name for s in spans if s.attributes.get("gen_ai.tool.name")] == [
        expected_name
    ] * LOOP_CALLS
    mapped = map_spans(spans)
    check_loop(mapped)
    # GenAI call ids are recorded, one per call.
    assert [c.call_id for c in mapped.tools] == [f"call_{i}" for i in range(LOOP_CALLS)]
    # The same result each time: no new evidence.
    assert len({c.result_digest for c in mapped.tools}) == 1
    assert mapped.tools[0].result_digest is not None
    # The run span carries gen_ai.aggregated_usage.* (format 5), never counted as a model call.
    assert [r.agent for r in mapped.runs] == ["looper"]


@pytest.mark.parametrize("version", [5, 2])
def test_distinct_agent(version: int) -> None:
    mapped = map_spans(run_pydantic_ai(False, version=version))
    check_distinct(mapped)
    assert len({c.result_digest for c in mapped.tools}) == 12


def test_aggregated_usage_sits_on_the_run_span() -> None:
    spans = run_pydantic_ai(True, version=5)
    (run,) = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_agent"]
    assert run.attributes["gen_ai.aggregated_usage.input_tokens"] == 90
    assert "gen_ai.usage.input_tokens" not in run.attributes


def test_include_content_off_gives_name_only_calls() -> None:
    """With ``include_content=False`` no arguments are recorded: ABSENT, never ``{}``."""
    import warnings

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from pydantic_ai import Agent
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    n = {"i": 0}

    def model_fn(messages, info):  # type: ignore[no-untyped-def]
        n["i"] += 1
        if n["i"] <= 2:
            return ModelResponse(parts=[ToolCallPart("search_docs", {"query": "refund policy"})])
        return ModelResponse(parts=[TextPart("done")])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        settings = InstrumentationSettings(tracer_provider=provider, include_content=False)
    agent = Agent(FunctionModel(model_fn), capabilities=[Instrumentation(settings=settings)])

    @agent.tool_plain
    def search_docs(query: str) -> str:
        return "no results"

    agent.run_sync("hi")
    mapped = map_spans(tuple(exporter.get_finished_spans()))
    assert [c.tool for c in mapped.tools] == ["search_docs", "search_docs"]
    assert all(signature_of(c.tool, c.arguments).name_only for c in mapped.tools)
