"""The OpenTelemetry-only path in LangChain and LangGraph: ``tripwire.otel.instrument()`` plus
``tripwire.check()`` at the top of each tool, under OpenInference and OpenLLMetry.

This path reports rather than refuses (the flag is raised when the 4th identical tool span
ends, so the 5th call's ``check()`` stops the run); the test asserts that it does stop the run,
through the real instrumentations.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

pytest.importorskip("langchain")
pytest.importorskip("langgraph")
pytest.importorskip("opentelemetry.sdk")

from langchain.agents import create_agent
from langchain_core.tools import BaseTool, tool
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent
from opentelemetry.sdk.trace import TracerProvider

import tripwire
from tripwire import LoopDetected
from tripwire.otel import instrument

from .agent_scripts import looping, scripted
from .lc_fakes import ScriptedChatModel
from .scripts import Counters, healthy_calls, run_body

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::tripwire.prices.CostNotFoundWarning"),
]

def checked_tools(counters: Counters) -> list[BaseTool]:
    """The tools as the docs say to write them: ``tripwire.check(tool=...)`` first."""

    @tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        tripwire.check(tool="search_docs")
        return run_body(counters, "search_docs", {"query": query})

    @tool
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        tripwire.check(tool="fetch_page")
        return run_body(counters, "fetch_page", {"url": url})

    return [search_docs, fetch_page]


def instrumented(instrumentation: str) -> Any:
    if instrumentation == "openinference":
        mod = pytest.importorskip("openinference.instrumentation.langchain")
        return mod.LangChainInstrumentor()
    mod = pytest.importorskip("opentelemetry.instrumentation.langchain")
    return mod.LangchainInstrumentor()


def run_otel(graph_kind: str, instrumentation: str, script: Any, counters: Counters) -> Any:
    from frameworks.harness import remove_leftover_patches

    provider = TracerProvider()
    instrument(provider=provider)
    instrumentor = instrumented(instrumentation)
    model = ScriptedChatModel(script=script, counters=counters)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if graph_kind == "create_agent":
            graph = create_agent(model, checked_tools(counters), name="looper")
        else:
            graph = create_react_agent(model, checked_tools(counters), name="looper")
    instrumentor.instrument(tracer_provider=provider)
    try:
        return graph.invoke(
            {"messages": [{"role": "user", "content": "What is the refund policy?"}]},
            {"recursion_limit": 100},
        )
    finally:
        instrumentor.uninstrument()
        if instrumentation == "openllmetry":
            remove_leftover_patches(
                "opentelemetry.instrumentation.langchain", ("langchain", "langgraph")
            )
        provider.shutdown()


CASES = [
    pytest.param("create_agent", "openllmetry", id="create_agent-openllmetry"),
    pytest.param("create_agent", "openinference", id="create_agent-openinference"),
    pytest.param("create_react_agent", "openllmetry", id="create_react_agent-openllmetry"),
    pytest.param("create_react_agent", "openinference", id="create_react_agent-openinference"),
]  # fmt: skip


@pytest.mark.parametrize(("graph_kind", "instrumentation"), CASES)
def test_the_otel_path_stops_a_looping_agent(graph_kind: str, instrumentation: str) -> None:
    counters = Counters()
    stopped = None
    try:
        run_otel(graph_kind, instrumentation, looping, counters)
    except LoopDetected as exc:
        stopped = exc
    except GraphRecursionError:
        pass  # the model looped until LangGraph's own recursion limit: not stopped
    assert stopped is not None, f"not stopped: {counters.loop_bodies} identical bodies ran"
    assert counters.loop_bodies <= 4  # the 4th span raises the flag; the 5th check() stops
    assert stopped.tool == "search_docs"


@pytest.mark.parametrize("instrumentation", ["openllmetry", "openinference"])
@pytest.mark.parametrize("graph_kind", ["create_agent", "create_react_agent"])
def test_the_otel_path_leaves_a_healthy_agent_alone(graph_kind: str, instrumentation: str) -> None:
    counters = Counters()
    out = run_otel(graph_kind, instrumentation, scripted(healthy_calls()), counters)
    assert out["messages"][-1].content == "done" and counters.tool_bodies == 30
