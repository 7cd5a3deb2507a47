"""The OpenAI Agents SDK on ``agents.testing.ScriptedModel``, via OpenInference and OpenLLMetry bridges."""

from __future__ import annotations

import pytest

pytest.importorskip("agents")
pytest.importorskip("agents.testing")

from .checks import check_distinct, check_loop
from .harness import LOOP_CALLS, map_spans, run_openai_agents

pytestmark = pytest.mark.frameworks

BRIDGES = ["openinference", "openllmetry"]


def _needs(bridge: str) -> None:
    if bridge == "openinference":
        pytest.importorskip("openinference.instrumentation.openai_agents")
    else:
        mod = pytest.importorskip("opentelemetry.instrumentation.openai_agents")
        if not hasattr(mod, "OpenAIAgentsInstrumentor"):
            pytest.skip("another package owns opentelemetry.instrumentation.openai_agents")


@pytest.mark.parametrize("bridge", BRIDGES)
def test_looping_agent(bridge: str) -> None:
    _needs(bridge)
    mapped = map_spans(run_openai_agents(True, bridge=bridge))
    # OpenLLMetry's bridge records usage only from Responses-API spans (docs/emitters.md): the
    # model calls are there, with zero tokens.
    check_loop(mapped, usage=bridge == "openinference")
    # No call ids on either bridge's tool spans.
    assert {c.call_id for c in mapped.tools} == {None}
    assert len({c.result_digest for c in mapped.tools}) == 1
    agents = {r.agent for r in mapped.runs}
    assert "looper" in agents


@pytest.mark.parametrize("bridge", BRIDGES)
def test_distinct_agent(bridge: str) -> None:
    _needs(bridge)
    mapped = map_spans(run_openai_agents(False, bridge=bridge))
    check_distinct(mapped, usage=bridge == "openinference")


def test_turn_and_task_spans_are_skipped() -> None:
    _needs("openinference")
    spans = run_openai_agents(True, bridge="openinference")
    turns = [s for s in spans if s.name == "turn"]
    assert len(turns) == LOOP_CALLS + 1
    mapped = map_spans(spans)
    assert mapped.stats.other_spans >= len(turns)
    assert mapped.stats.malformed == 0


def test_bridges_do_not_leak_between_runs() -> None:
    _needs("openinference")
    _needs("openllmetry")
    first = run_openai_agents(True, bridge="openinference")
    second = run_openai_agents(True, bridge="openllmetry")
    third = run_openai_agents(True, bridge="openinference")
    assert {s.instrumentation_scope.name for s in first} == {
        "openinference.instrumentation.openai_agents"
    }
    assert {s.instrumentation_scope.name for s in second} == {
        "opentelemetry.instrumentation.openai_agents"
    }
    assert len(third) == len(first)
