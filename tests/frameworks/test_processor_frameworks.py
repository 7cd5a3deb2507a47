"""Real agent frameworks, offline, through their own instrumentation into TripwireSpanProcessor.

For each framework: the looping agent (8 calls of ``search_docs(query="refund policy")``) is flagged
at its 4th call and its next step is refused by ``tripwire.otel.check()`` called at the top of
the tool body; the agent with 12 distinct calls is not flagged; a looping and a working agent
through one processor are judged separately (pydantic-ai: concurrently, in two threads; Google
ADK: concurrently, as two tasks of one event loop; the others patch globals when instrumenting,
which the harness runs one at a time).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import tripwire.otel as tw
from tripwire.core.reasons import Rule, Verdict
from tripwire.errors import LoopDetected
from tripwire.otel.processor import TripwireSpanProcessor, VerdictChange

from . import harness

pytestmark = pytest.mark.frameworks


@dataclass
class Framework:
    name: str
    module: str
    run: Callable[..., Any]
    context_in_tools: bool = True
    """False when the instrumentation does not make the tool span current inside the tool body
    (OpenInference's LangChain tracer): ``check()`` without a trace id cannot find the run."""
    concurrent: Callable[[tuple[bool, ...], TracerProvider], list[Any]] | None = None
    """Runs several agents at once (as tasks of one event loop) into one provider, returning
    each run's exception (``None`` when it answered). ``None``: pydantic-ai runs in two threads
    in the test below, the others one run at a time."""


FRAMEWORKS = [
    Framework("pydantic-ai", "pydantic_ai", lambda loop, p: harness.run_pydantic_ai(loop, provider=p)),
    Framework(
        "langchain+openinference", "openinference.instrumentation.langchain",
        lambda loop, p: harness.run_langchain(loop, provider=p), context_in_tools=False,
    ),
    Framework(
        "langchain+openllmetry", "opentelemetry.instrumentation.langchain",
        lambda loop, p: harness.run_langchain(loop, instrumentation="openllmetry", provider=p),
    ),
    Framework(
        "openai-agents+openinference", "openinference.instrumentation.openai_agents",
        lambda loop, p: harness.run_openai_agents(loop, provider=p),
    ),
    Framework(
        "openai-agents+openllmetry", "opentelemetry.instrumentation.openai_agents",
        lambda loop, p: harness.run_openai_agents(loop, bridge="openllmetry", provider=p),
    ),
    Framework(
        "smolagents", "openinference.instrumentation.smolagents",
        lambda loop, p: harness.run_smolagents(loop, provider=p),
    ),
    Framework(
        "google-adk", "google.adk", lambda loop, p: harness.run_adk(loop, provider=p),
        concurrent=lambda loops, p: harness.run_adk_concurrently(loops, provider=p)[1],
    ),
    Framework(
        "google-adk-legacy", "google.adk",
        lambda loop, p: harness.run_adk(loop, schema=1, provider=p),
        concurrent=lambda loops, p: harness.run_adk_concurrently(loops, schema=1, provider=p)[1],
    ),
]  # fmt: skip


@dataclass
class Setup:
    provider: TracerProvider
    processor: TripwireSpanProcessor
    changes: list[VerdictChange] = field(default_factory=list)
    executed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@pytest.fixture
def setup(monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    """A provider with tripwire standing alone; the tools call ``tw.check()`` first."""
    tw.KILL_FLAGS.clear_all()
    provider = TracerProvider()
    s = Setup(provider, TripwireSpanProcessor())
    s.processor._callbacks = (s.changes.append,)
    provider.add_span_processor(s.processor)
    search, fetch = harness.search_docs_impl, harness.fetch_page_impl

    def guarded_search(query: str) -> str:
        tw.check()  # the runtime's check before the step: raises once the run is flagged
        with s.lock:
            s.executed.append(query)
        return search(query)

    def guarded_fetch(url: str) -> str:
        tw.check()
        with s.lock:
            s.executed.append(url)
        return fetch(url)

    monkeypatch.setattr(harness, "search_docs_impl", guarded_search)
    monkeypatch.setattr(harness, "fetch_page_impl", guarded_fetch)
    yield s
    provider.shutdown()
    tw.KILL_FLAGS.clear_all()


def _run(fw: Framework, loop: bool, provider: TracerProvider) -> BaseException | None:
    pytest.importorskip(fw.module)
    try:
        fw.run(loop, provider)
    except LoopDetected as exc:  # pydantic-ai, LangChain, ADK: the tool's exception ends the run
        return exc
    return None  # the OpenAI Agents SDK and smolagents report it to the model as the tool result


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_looping_agent_is_flagged_at_the_fourth_call_and_refused(fw: Framework, setup: Setup) -> None:
    _run(fw, True, setup.provider)
    stuck = [c for c in setup.changes if c.assessment.verdict is Verdict.STUCK]
    assert len(stuck) == 1, setup.changes
    (change,) = stuck
    assert change.flagged
    a = change.assessment
    assert (a.rule, a.tool, a.call_index, a.hits) == (Rule.REPETITION, "search_docs", 4, 4)
    assert tw.KILL_FLAGS.get(change.trace_id) is not None
    assert setup.processor.stats.internal_errors == 0
    if fw.context_in_tools:
        # calls 1-4 ran; every later step was refused by check() before the tool body
        assert setup.executed == ["refund policy"] * 4
    else:
        with pytest.raises(LoopDetected):
            tw.check(change.trace_id)  # the runtime must pass the trace id itself here


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_distinct_agent_is_not_flagged(fw: Framework, setup: Setup) -> None:
    assert _run(fw, False, setup.provider) is None
    assert [c for c in setup.changes if c.assessment.verdict is not Verdict.WORKING] == []
    assert len(setup.executed) == harness.DISTINCT_CALLS
    assert len(tw.KILL_FLAGS) == 0
    assert setup.processor.stats.tool_calls >= harness.DISTINCT_CALLS


@pytest.mark.parametrize("fw", FRAMEWORKS, ids=lambda f: f.name)
def test_looping_and_working_agents_are_judged_separately(fw: Framework, setup: Setup) -> None:
    """One processor, two runs: only the looping run's trace is flagged."""
    pytest.importorskip(fw.module)  # here, not inside the threads below
    if fw.name == "pydantic-ai":
        results: dict[bool, Any] = {}

        def run(loop: bool) -> None:
            results[loop] = _run(fw, loop, setup.provider)

        threads = [threading.Thread(target=run, args=(loop,)) for loop in (True, False)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results[False] is None
    elif fw.concurrent is not None:  # Google ADK: two runs as tasks of one event loop
        outcomes = fw.concurrent((True, False), setup.provider)
        assert isinstance(outcomes[0], LoopDetected)
        assert outcomes[1] is None
        # They did run at once: the working agent made calls between the looper's first and last.
        loop_at = [i for i, x in enumerate(setup.executed) if x == "refund policy"]
        assert any(x != "refund policy" for x in setup.executed[loop_at[0] : loop_at[-1]])
    else:
        _run(fw, False, setup.provider)
        _run(fw, True, setup.provider)
    stuck = {c.trace_id for c in setup.changes if c.assessment.verdict is Verdict.STUCK}
    assert len(stuck) == 1
    assert len(tw.KILL_FLAGS) == 1
    distinct_done = [x for x in setup.executed if x != "refund policy"]
    assert len(distinct_done) == harness.DISTINCT_CALLS  # the working agent was never refused
    if fw.context_in_tools:
        assert setup.executed.count("refund policy") == 4
