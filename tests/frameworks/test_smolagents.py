"""smolagents ``ToolCallingAgent`` on a scripted ``OpenAIModel``, via OpenInference."""

from __future__ import annotations

import pytest

pytest.importorskip("smolagents")
pytest.importorskip("openinference.instrumentation.smolagents")

from tripwire.otel.conventions import RunBoundary

from .checks import check_distinct, check_loop
from .harness import DISTINCT_CALLS, INPUT_TOKENS, LOOP_CALLS, map_spans, run_smolagents

pytestmark = pytest.mark.frameworks


def _without_final_answer(mapped):  # type: ignore[no-untyped-def]
    """smolagents records ``final_answer`` as a tool span (docs/emitters.md): set it aside."""
    from dataclasses import replace

    finals = [c for c in mapped.tools if c.tool == "final_answer"]
    assert len(finals) == 1
    return replace(mapped, tools=tuple(c for c in mapped.tools if c.tool != "final_answer"))


def test_looping_agent() -> None:
    spans = run_smolagents(True)
    # The tool span is named after the tool class, not the tool.
    assert {s.name for s in spans if s.attributes.get("tool.name") == "search_docs"} == {
        "SimpleTool"
    }
    mapped = map_spans(spans)
    # One model call per step: 8 tool calls + the final_answer call.
    check_loop(_without_final_answer(mapped), model_calls=LOOP_CALLS + 1)
    (run,) = mapped.runs
    assert isinstance(run, RunBoundary)
    assert run.parent_span_id is None


def test_distinct_agent() -> None:
    mapped = map_spans(run_smolagents(False))
    check_distinct(_without_final_answer(mapped), model_calls=DISTINCT_CALLS + 1)


def test_run_span_aggregate_is_not_counted_again() -> None:
    spans = run_smolagents(True)
    (agent,) = [s for s in spans if s.attributes.get("openinference.span.kind") == "AGENT"]
    assert agent.attributes["llm.token_count.prompt"] == (LOOP_CALLS + 1) * INPUT_TOKENS
    mapped = map_spans(spans)
    assert sum(m.input_tokens for m in mapped.models) == (LOOP_CALLS + 1) * INPUT_TOKENS
