"""LangChain ``create_agent`` (LangGraph) on GenericFakeChatModel, via OpenInference and OpenLLMetry."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langchain")
pytest.importorskip("langgraph")

from .checks import check_distinct, check_loop
from .harness import LOOP_ARGS, LOOP_CALLS, map_spans, run_langchain

pytestmark = pytest.mark.frameworks


def _needs(instrumentation: str) -> None:
    if instrumentation == "openinference":
        pytest.importorskip("openinference.instrumentation.langchain")
    else:
        pytest.importorskip("opentelemetry.instrumentation.langchain")


INSTRUMENTATIONS = ["openinference", "openllmetry"]


@pytest.mark.parametrize("instrumentation", INSTRUMENTATIONS)
def test_looping_agent(instrumentation: str) -> None:
    _needs(instrumentation)
    spans = run_langchain(True, instrumentation=instrumentation)
    mapped = map_spans(spans)
    # OpenInference records the single string argument as bare text (docs/emitters.md).
    check_loop(mapped, args="refund policy" if instrumentation == "openinference" else LOOP_ARGS)
    # Call ids come from the envelope (OpenLLMetry) or the ToolMessage result (OpenInference).
    assert [c.call_id for c in mapped.tools] == [f"call_{i}" for i in range(LOOP_CALLS)]
    # The ToolMessage's changing ids are not part of the result digest.
    assert len({c.result_digest for c in mapped.tools}) == 1
    assert mapped.tools[0].result_digest is not None
    assert "looper" in {r.agent for r in mapped.runs}


@pytest.mark.parametrize("instrumentation", INSTRUMENTATIONS)
def test_distinct_agent(instrumentation: str) -> None:
    _needs(instrumentation)
    mapped = map_spans(run_langchain(False, instrumentation=instrumentation))
    check_distinct(mapped)


def test_openinference_records_a_single_string_argument_as_bare_text() -> None:
    _needs("openinference")
    spans = run_langchain(True, instrumentation="openinference")
    tool_spans = [s for s in spans if s.attributes.get("openinference.span.kind") == "TOOL"]
    assert len(tool_spans) == LOOP_CALLS
    assert {s.attributes["input.value"] for s in tool_spans} == {"refund policy"}
    # ...and the agent run is a root CHAIN span, not an AGENT span.
    (root,) = [s for s in spans if s.parent is None]
    assert (root.name, root.attributes["openinference.span.kind"]) == ("looper", "CHAIN")


def test_openllmetry_wraps_arguments_in_a_changing_envelope() -> None:
    _needs("openllmetry")
    spans = run_langchain(True, instrumentation="openllmetry")
    raw = [
        s.attributes["gen_ai.tool.call.arguments"]
        for s in spans
        if s.attributes.get("traceloop.span.kind") == "tool"
    ]
    assert len(raw) == LOOP_CALLS
    assert len(set(raw)) == LOOP_CALLS  # every envelope differs...
    envelopes = [json.loads(r) for r in raw]
    assert {json.dumps(e["inputs"]) for e in envelopes} == {
        '{"query": "refund policy"}'
    }  # ...not the call
    assert [e["metadata"]["langgraph_step"] for e in envelopes] == list(
        range(2, 2 * LOOP_CALLS + 1, 2)
    )
    names = {s.name for s in spans if s.attributes.get("gen_ai.operation.name") == "invoke_agent"}
    assert names == {"invoke_agent looper", "looper.workflow"}


def test_instrumentors_do_not_leak_between_runs() -> None:
    _needs("openinference")
    _needs("openllmetry")
    first = run_langchain(True, instrumentation="openinference")
    second = run_langchain(True, instrumentation="openllmetry")
    assert {s.instrumentation_scope.name for s in first} == {
        "openinference.instrumentation.langchain"
    }
    assert {s.instrumentation_scope.name for s in second} == {
        "opentelemetry.instrumentation.langchain"
    }
