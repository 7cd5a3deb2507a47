"""Run real agent frameworks offline, through their own OpenTelemetry instrumentation.

Each ``run_*`` function builds one small agent on the framework's own fake or scripted model,
runs it to the end and returns the finished spans. Two scripts:

- ``loop=True``: the model keeps asking for ``search_docs(query="refund policy")``
  :data:`LOOP_CALLS` times, then answers;
- ``loop=False``: the model makes :data:`DISTINCT_CALLS` different calls (alternating
  ``search_docs`` and ``fetch_page`` with different arguments), then answers.

Every model call reports :data:`INPUT_TOKENS` / :data:`OUTPUT_TOKENS` where the framework lets
the fake model report usage, so a test can check usage is counted once per model call.

Tracing: pass ``provider`` (a ``TracerProvider`` you built, e.g. with tripwire's span processor
attached) and/or ``exporter``. Without a provider, one is built with a ``SimpleSpanProcessor``
into ``exporter`` (a fresh ``InMemorySpanExporter`` when not given). The returned tuple is what
``exporter`` finished during the run (empty when you passed a provider but no exporter).

Instrumentors patch globals: every function instruments at its start and uninstruments in a
``finally``, so runs don't leak into each other (Google ADK has no instrumentor: its own tracer
is routed into the provider and back, see :func:`adk_telemetry`). Not thread-safe: run one at a
time (:func:`run_adk_concurrently` runs several ADK agents at once, on one event loop).

Frameworks are imported inside each function; callers skip with ``pytest.importorskip``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tripwire.core.events import ModelCall, ToolCall
from tripwire.spans import MappingStats, RunBoundary, map_span, view_from_readable_span

LOOP_CALLS = 8
"""How many times the looping agent calls ``search_docs(query="refund policy")``."""
DISTINCT_CALLS = 12
"""How many different calls the working agent makes."""
INPUT_TOKENS = 10
"""Input tokens each scripted model call reports."""
OUTPUT_TOKENS = 3
"""Output tokens each scripted model call reports."""
LOOP_ARGS: dict[str, Any] = {"query": "refund policy"}
"""The arguments the looping agent repeats."""


TOPICS = ("billing", "shipping", "returns", "warranty", "invoices", "accounts")
"""The distinct script's ``search_docs`` queries (words, not numbers: result digests mask digits)."""
PAGES = ("faq", "pricing", "contact", "terms", "privacy", "status")
"""The distinct script's ``fetch_page`` pages."""


def script(loop: bool) -> list[tuple[str, dict[str, Any]]]:
    """The (tool, arguments) calls the fake model asks for, in order."""
    if loop:
        return [("search_docs", dict(LOOP_ARGS)) for _ in range(LOOP_CALLS)]
    calls: list[tuple[str, dict[str, Any]]] = []
    for topic, page in zip(TOPICS, PAGES, strict=True):
        calls.append(("search_docs", {"query": topic}))
        calls.append(("fetch_page", {"url": f"https://docs.example/{page}"}))
    assert len(calls) == DISTINCT_CALLS
    return calls


def search_docs_impl(query: str) -> str:
    """The ``search_docs`` tool body shared by every framework."""
    return "no results" if query == LOOP_ARGS["query"] else f"results about {query}"


def fetch_page_impl(url: str) -> str:
    """The ``fetch_page`` tool body shared by every framework."""
    return f"<html>{url}</html>"


@contextlib.contextmanager
def _tracing(
    provider: TracerProvider | None, exporter: InMemorySpanExporter | None
) -> Iterator[tuple[TracerProvider, InMemorySpanExporter | None]]:
    if provider is None:
        exporter = exporter or InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter


@dataclass(frozen=True, slots=True)
class Mapped:
    """What :func:`~tripwire.spans.map_span` extracted from one run's spans."""

    tools: tuple[ToolCall, ...]
    """Tool calls, in span end order."""
    models: tuple[ModelCall, ...]
    """Model calls, in span end order."""
    runs: tuple[RunBoundary, ...]
    """Run boundaries, in span end order (inner ones end first)."""
    stats: MappingStats
    """The mapping counters."""
    trace_ids: frozenset[str]
    """The traces the tool calls belong to."""


def map_spans(spans: tuple[ReadableSpan, ...]) -> Mapped:
    """Map finished SDK spans with :func:`~tripwire.spans.map_span`, by kind."""
    stats = MappingStats()
    tools: list[ToolCall] = []
    models: list[ModelCall] = []
    runs: list[RunBoundary] = []
    traces: set[str] = set()
    for span in spans:
        view = view_from_readable_span(span)
        event = map_span(view, stats=stats)
        if isinstance(event, ToolCall):
            tools.append(event)
            traces.add(view.trace_id)
        elif isinstance(event, ModelCall):
            models.append(event)
        elif isinstance(event, RunBoundary):
            runs.append(event)
    return Mapped(tuple(tools), tuple(models), tuple(runs), stats, frozenset(traces))


def _finished(exporter: InMemorySpanExporter | None) -> tuple[ReadableSpan, ...]:
    return tuple(exporter.get_finished_spans()) if exporter is not None else ()


# -- pydantic-ai -------------------------------------------------------------------------------


def run_pydantic_ai(
    loop: bool,
    *,
    version: int = 5,
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[ReadableSpan, ...]:
    """Run a pydantic-ai agent on ``FunctionModel`` with its built-in instrumentation.

    Args:
        loop: the looping script or the distinct one (see the module docstring).
        version: pydantic-ai's instrumentation data format: 2 (legacy: ``running tool`` spans
            with ``tool_arguments``/``tool_response``) up to 5/6 (GenAI conventions:
            ``execute_tool {tool}`` with ``gen_ai.tool.call.arguments``).
        provider: the tracer provider to emit into (default: a fresh one into ``exporter``).
        exporter: where finished spans are collected.
    """
    from pydantic_ai import Agent
    from pydantic_ai.capabilities.instrumentation import Instrumentation
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.models.instrumented import InstrumentationSettings
    from pydantic_ai.usage import RequestUsage

    calls = script(loop)
    state = {"i": 0}

    def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        i = state["i"]
        state["i"] += 1
        usage = RequestUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS)
        if i < len(calls):
            name, args = calls[i]
            return ModelResponse(
                parts=[ToolCallPart(name, args, tool_call_id=f"call_{i}")], usage=usage
            )
        return ModelResponse(parts=[TextPart("done")], usage=usage)

    with _tracing(provider, exporter) as (tp, exp), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # versions 2-4 are deprecated formats, on purpose here
        settings = InstrumentationSettings(tracer_provider=tp, version=version)  # type: ignore[arg-type]
        agent = Agent(
            FunctionModel(model_fn),
            name="looper" if loop else "researcher",
            capabilities=[Instrumentation(settings=settings)],
        )

        @agent.tool_plain
        def search_docs(query: str) -> str:
            return search_docs_impl(query)

        @agent.tool_plain
        def fetch_page(url: str) -> str:
            return fetch_page_impl(url)

        result = agent.run_sync("What is the refund policy?")
        assert result.output == "done"
        return _finished(exp)


def remove_leftover_patches(wrapper_module: str, module_prefixes: tuple[str, ...]) -> int:
    """Undo ``wrapt`` patches an instrumentor's ``uninstrument()`` left behind. Returns how many.

    ``opentelemetry-instrumentation-langchain`` 0.62 calls ``unwrap("langchain_core.callbacks",
    "BaseCallbackManager.__init__")``, which ``opentelemetry.instrumentation.utils.unwrap``
    cannot resolve (it wants ``"module.Class", "attr"``): every patch stays, and the next
    ``instrument()`` wraps again *under* the old handler, so a second run's spans go to the
    first run's tracer provider. This walks the loaded ``module_prefixes`` modules (functions
    and class attributes) and restores whatever ``wrapper_module``'s wrappers wrap.
    """
    import sys

    import wrapt

    def is_leftover(value: Any) -> bool:
        if not isinstance(value, wrapt.FunctionWrapper):
            return False
        wrapper = getattr(value, "_self_wrapper", None)
        owner = getattr(wrapper, "__module__", None) or type(wrapper).__module__
        return isinstance(owner, str) and owner.startswith(wrapper_module)

    restored = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(module_prefixes):
            continue
        for attr, value in list(vars(module).items()):
            owners: list[tuple[Any, str, Any]] = [(module, attr, value)]
            if isinstance(value, type) and value.__module__ == name:
                owners += [(value, k, v) for k, v in list(vars(value).items())]
            for owner, key, item in owners:
                while is_leftover(item):
                    item = item.__wrapped__
                    setattr(owner, key, item)
                    restored += 1
    return restored


# -- LangChain / LangGraph ---------------------------------------------------------------------


def _langchain_agent(loop: bool, graph: str = "create_agent") -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    class ToolCallingFakeChatModel(GenericFakeChatModel):
        """``GenericFakeChatModel`` plus the ``bind_tools`` that ``create_agent`` needs."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    usage = {"input_tokens": INPUT_TOKENS, "output_tokens": OUTPUT_TOKENS,
             "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS}  # fmt: skip
    messages = [
        AIMessage(
            content="",
            tool_calls=[{"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}],
            usage_metadata=usage,  # type: ignore[arg-type]
        )
        for i, (name, args) in enumerate(script(loop))
    ]
    messages.append(AIMessage(content="done", usage_metadata=usage))  # type: ignore[arg-type]

    @tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        return search_docs_impl(query)

    @tool
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return fetch_page_impl(url)

    model = ToolCallingFakeChatModel(messages=iter(messages))
    name = "looper" if loop else "researcher"
    if graph == "create_react_agent":
        # LangGraph's prebuilt (deprecated in favour of create_agent, still widely used): under
        # OpenInference its model node is an ``openinference.span.kind = AGENT`` span.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from langgraph.prebuilt import create_react_agent

            return create_react_agent(model, tools=[search_docs, fetch_page], name=name)
    return create_agent(model, tools=[search_docs, fetch_page], name=name)


def run_langchain(
    loop: bool,
    *,
    instrumentation: str = "openinference",
    graph: str = "create_agent",
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[ReadableSpan, ...]:
    """Run a LangChain ``create_agent`` (LangGraph) agent on ``GenericFakeChatModel``.

    Args:
        loop: the looping script or the distinct one.
        instrumentation: ``"openinference"`` (``openinference-instrumentation-langchain``) or
            ``"openllmetry"`` (``opentelemetry-instrumentation-langchain``, traceloop).
        graph: ``"create_agent"`` (LangChain v1) or ``"create_react_agent"`` (LangGraph's
            prebuilt).
        provider: the tracer provider to emit into (default: a fresh one into ``exporter``).
        exporter: where finished spans are collected.
    """
    instrumentor: Any
    if instrumentation == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        instrumentor = LangChainInstrumentor()
    elif instrumentation == "openllmetry":
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        instrumentor = LangchainInstrumentor()
    else:
        raise ValueError(
            f"instrumentation must be 'openinference' or 'openllmetry', got {instrumentation!r}"
        )

    with _tracing(provider, exporter) as (tp, exp):
        agent = _langchain_agent(loop, graph)
        instrumentor.instrument(tracer_provider=tp)
        try:
            out = agent.invoke(
                {"messages": [{"role": "user", "content": "What is the refund policy?"}]},
                {"recursion_limit": 100},
            )
        finally:
            instrumentor.uninstrument()
            if instrumentation == "openllmetry":
                remove_leftover_patches(
                    "opentelemetry.instrumentation.langchain", ("langchain", "langgraph")
                )
        assert out["messages"][-1].content == "done"
        return _finished(exp)


# -- OpenAI Agents SDK -------------------------------------------------------------------------


def run_openai_agents(
    loop: bool,
    *,
    bridge: str = "openinference",
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[ReadableSpan, ...]:
    """Run an OpenAI Agents SDK agent on ``agents.testing.ScriptedModel``, through an OTel bridge.

    The scripted model's ``generation`` span carries no usage by itself; each step's responder
    fills it the way the SDK's chat-completions model does (``span_data.usage`` and
    ``span_data.model``), so the bridge sees real usage.

    Args:
        loop: the looping script or the distinct one.
        bridge: ``"openinference"`` (``openinference-instrumentation-openai-agents``) or
            ``"openllmetry"`` (``opentelemetry-instrumentation-openai-agents``).
        provider: the tracer provider to emit into (default: a fresh one into ``exporter``).
        exporter: where finished spans are collected.
    """
    from agents import Agent, Runner, function_tool, set_trace_processors, set_tracing_disabled
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
    from agents.tracing import get_current_span
    from agents.usage import Usage

    instrumentor: Any
    if bridge == "openinference":
        from openinference.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        instrumentor = OpenAIAgentsInstrumentor()
    elif bridge == "openllmetry":
        from opentelemetry.instrumentation.openai_agents import (  # type: ignore[no-redef]
            OpenAIAgentsInstrumentor,
        )

        instrumentor = OpenAIAgentsInstrumentor()
    else:
        raise ValueError(f"bridge must be 'openinference' or 'openllmetry', got {bridge!r}")

    def step(output: list[Any]) -> ModelStep:
        usage = Usage(requests=1, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                      total_tokens=INPUT_TOKENS + OUTPUT_TOKENS)  # fmt: skip

        def responder(call: Any) -> ModelStep:
            span = get_current_span()
            if span is not None and hasattr(span.span_data, "usage"):
                span.span_data.model = "scripted-model"
                span.span_data.usage = {
                    "input_tokens": INPUT_TOKENS,
                    "output_tokens": OUTPUT_TOKENS,
                }
            return ModelStep(output=output, usage=usage)

        return ModelStep.respond(responder)

    steps = [
        step([function_call(name, args, call_id=f"call_{i}")])
        for i, (name, args) in enumerate(script(loop))
    ]
    steps.append(step([assistant_message("done")]))

    @function_tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        return search_docs_impl(query)

    @function_tool
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return fetch_page_impl(url)

    model = ScriptedModel(steps, emit_traces=True)
    agent = Agent(
        name="looper" if loop else "researcher", model=model, tools=[search_docs, fetch_page]
    )
    with _tracing(provider, exporter) as (tp, exp):
        set_trace_processors([])  # no upload to the OpenAI backend: the bridge is the only sink
        # The SDK caches "tracing disabled" process-wide (from its environment, or from an
        # earlier run in this process); these runs need its traces, whatever ran before.
        set_tracing_disabled(False)
        instrumentor.instrument(tracer_provider=tp)
        try:
            result = Runner.run_sync(agent, "What is the refund policy?", max_turns=50)
        finally:
            instrumentor.uninstrument()
            set_trace_processors([])
        assert result.final_output == "done"
        model.assert_complete()
        return _finished(exp)


# -- smolagents --------------------------------------------------------------------------------


def run_smolagents(
    loop: bool,
    *,
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[ReadableSpan, ...]:
    """Run a smolagents ``ToolCallingAgent`` through ``openinference-instrumentation-smolagents``.

    The model is a minimal ``OpenAIModel`` subclass whose client is a local fake returning
    scripted chat completions: the instrumentor wraps ``generate`` only on smolagents' own
    model classes, so subclassing one keeps the model spans (a bare ``Model`` subclass that
    overrides ``generate`` emits none).

    Args:
        loop: the looping script or the distinct one.
        provider: the tracer provider to emit into (default: a fresh one into ``exporter``).
        exporter: where finished spans are collected.
    """
    from openai.types.chat import ChatCompletion
    from openinference.instrumentation.smolagents import SmolagentsInstrumentor
    from smolagents import OpenAIModel, ToolCallingAgent, tool

    calls = [*script(loop), ("final_answer", {"answer": "done"})]

    class _Completions:
        def __init__(self) -> None:
            self.i = 0

        def create(self, **kwargs: Any) -> ChatCompletion:
            i = self.i
            self.i += 1
            name, args = calls[min(i, len(calls) - 1)]
            return ChatCompletion.model_validate(
                {
                    "id": f"chatcmpl-{i}", "object": "chat.completion", "created": 0,
                    "model": "scripted-model",
                    "choices": [{
                        "index": 0, "finish_reason": "tool_calls",
                        "message": {"role": "assistant", "content": None, "tool_calls": [{
                            "id": f"call_{i}", "type": "function",
                            "function": {"name": name, "arguments": json.dumps(args)},
                        }]},
                    }],
                    "usage": {"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                              "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS},
                }
            )  # fmt: skip

    class _Chat:
        def __init__(self) -> None:
            self.completions = _Completions()

    class _Client:
        def __init__(self) -> None:
            self.chat = _Chat()

    class ScriptedOpenAIModel(OpenAIModel):  # type: ignore[misc]
        """``OpenAIModel`` whose client answers from the script, offline."""

        def create_client(self) -> Any:
            return _Client()

    @tool
    def search_docs(query: str) -> str:
        """Search the documentation.

        Args:
            query: what to look for.
        """
        return search_docs_impl(query)

    @tool
    def fetch_page(url: str) -> str:
        """Fetch one page.

        Args:
            url: the page address.
        """
        return fetch_page_impl(url)

    with _tracing(provider, exporter) as (tp, exp):
        instrumentor = SmolagentsInstrumentor()
        instrumentor.instrument(tracer_provider=tp)
        try:
            agent = ToolCallingAgent(
                tools=[search_docs, fetch_page],
                model=ScriptedOpenAIModel(model_id="scripted-model"),
                name="looper" if loop else "researcher",
                max_steps=50,
                verbosity_level=0,
            )
            answer = agent.run("What is the refund policy?")
        finally:
            instrumentor.uninstrument()
        assert answer == "done"
        return _finished(exp)


# -- Google ADK --------------------------------------------------------------------------------

ADK_SCHEMAS = (2, 1)
"""ADK's telemetry schemas: 2 (the default since ADK 2: GenAI conventions, ``invoke_workflow``
root, ``gen_ai.tool.call.arguments``) and 1 (legacy, ``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN=1``:
``invocation`` root, ``call_llm`` spans above ``generate_content``, and
``gcp.vertex.agent.tool_call_args``)."""

_ADK_ENV_VARS = (
    "ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN",
    "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
    "ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS",
)
_adk_active = threading.Lock()


def _swap_in_adk_modules(old: object, new: object) -> int:
    """Rebind every module global of ``google.adk`` that *is* ``old`` to ``new``. Returns how many.

    ADK's spans all come from one module-level tracer, ``google.adk.telemetry.tracing.tracer``
    (``trace.get_tracer("gcp.vertex.agent")``, taken from the *global* provider), which several
    ADK modules import by name, some of them lazily, during a run.
    """
    import sys

    swapped = 0
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("google.adk"):
            continue
        for attr, value in list(vars(module).items()):
            if value is old:
                setattr(module, attr, new)
                swapped += 1
    return swapped


@contextlib.contextmanager
def adk_telemetry(provider: TracerProvider, *, schema: int, capture: bool) -> Iterator[None]:
    """Route ADK's spans into ``provider`` and set its telemetry switches; restore both after.

    ADK takes its tracer from the global provider, which OpenTelemetry lets a process set only
    once: instead of touching it, this rebinds ADK's own tracer object (wherever an ADK module
    holds it) to a tracer of ``provider`` with the same scope, and puts the original back on the
    way out, in modules imported meanwhile too. The switches are environment variables ADK reads
    during the run: ``ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN`` (``schema``) and, for ``capture``,
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY`` (schema 2) /
    ``ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS`` (schema 1, on unless set false); without
    ``capture`` both are off. One at a time: entering it twice at once raises.
    """
    import os

    from google.adk import version as adk_version
    from google.adk.telemetry import tracing

    if schema not in ADK_SCHEMAS:
        raise ValueError(f"schema must be one of {ADK_SCHEMAS}, got {schema!r}")
    if not _adk_active.acquire(blocking=False):
        raise RuntimeError("adk_telemetry() is already active: run ADK agents one call at a time")
    original = tracing.tracer
    routed = provider.get_tracer("gcp.vertex.agent", adk_version.__version__)
    saved = {var: os.environ.get(var) for var in _ADK_ENV_VARS}
    try:
        os.environ["ADK_TELEMETRY_SCHEMA_VERSION_OPT_IN"] = str(schema)
        if capture:
            os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "SPAN_ONLY"
            os.environ["ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS"] = "true"
        else:
            os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "NO_CONTENT"
            os.environ["ADK_CAPTURE_MESSAGE_CONTENT_IN_SPANS"] = "false"
        assert _swap_in_adk_modules(original, routed) >= 1
        yield
    finally:
        _swap_in_adk_modules(routed, original)
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        _adk_active.release()


def _adk_agent(loop: bool) -> Any:
    """An ADK ``Agent`` (``LlmAgent``) on ADK's ``MockModel``, with two ``FunctionTool``s."""
    from google.adk.agents import Agent
    from google.adk.cli.agent_test_runner import MockModel
    from google.adk.models.llm_response import LlmResponse
    from google.adk.tools import FunctionTool
    from google.genai import types

    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=INPUT_TOKENS,
        candidates_token_count=OUTPUT_TOKENS,
        total_token_count=INPUT_TOKENS + OUTPUT_TOKENS,
    )
    responses = [
        LlmResponse(
            content=types.Content(role="model", parts=[types.Part(
                function_call=types.FunctionCall(name=name, args=args, id=f"call_{i}")
            )]),
            usage_metadata=usage,
        )
        for i, (name, args) in enumerate(script(loop))
    ]  # fmt: skip
    responses.append(
        LlmResponse(
            content=types.Content(role="model", parts=[types.Part.from_text(text="done")]),
            usage_metadata=usage,
        )
    )

    def search_docs(query: str) -> str:
        """Search the documentation."""
        return search_docs_impl(query)

    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return fetch_page_impl(url)

    return Agent(
        name="looper" if loop else "researcher",
        model=MockModel(responses=responses, requests=[]),
        instruction="Answer from the documentation.",
        tools=[FunctionTool(search_docs), FunctionTool(fetch_page)],
    )


async def _run_adk_agent(loop: bool) -> None:
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService
    from google.genai import types

    sessions = InMemorySessionService()
    runner = Runner(app_name="tripwire_test", agent=_adk_agent(loop), session_service=sessions)
    session = await sessions.create_session(app_name="tripwire_test", user_id="user")
    message = types.Content(
        role="user", parts=[types.Part.from_text(text="What is the refund policy?")]
    )
    texts: list[str] = []
    async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message):
        if event.content is not None and event.content.parts:
            texts += [p.text for p in event.content.parts if p.text]
    assert texts[-1:] == ["done"], texts


def run_adk(
    loop: bool,
    *,
    schema: int = 2,
    capture: bool = True,
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[ReadableSpan, ...]:
    """Run a Google ADK ``Agent`` on ADK's ``MockModel`` through ADK's ``Runner``.

    The session service is ADK's ``InMemorySessionService``; the spans are ADK's own
    (``gcp.vertex.agent``), routed into ``provider`` by :func:`adk_telemetry`. No request leaves
    the process: ``MockModel`` answers from its list of ``LlmResponse``s (each with usage).

    Args:
        loop: the looping script or the distinct one.
        schema: ADK's telemetry schema, 2 (default) or 1 (legacy); see :data:`ADK_SCHEMAS`.
        capture: record tool arguments and results (ADK's content-capture switches).
        provider: the tracer provider to emit into (default: a fresh one into ``exporter``).
        exporter: where finished spans are collected.
    """
    spans, (outcome,) = run_adk_concurrently(
        (loop,), schema=schema, capture=capture, provider=provider, exporter=exporter
    )
    if outcome is not None:
        raise outcome  # as with the other frameworks: the run's exception reaches the caller
    return spans


def run_adk_concurrently(
    loops: tuple[bool, ...],
    *,
    schema: int = 2,
    capture: bool = True,
    provider: TracerProvider | None = None,
    exporter: InMemorySpanExporter | None = None,
) -> tuple[tuple[ReadableSpan, ...], list[BaseException | None]]:
    """Run one ADK agent per entry of ``loops``, concurrently, as tasks of one event loop.

    Returns the finished spans and, per agent, the exception that ended its run (``None`` when
    it answered). Arguments as in :func:`run_adk`.
    """

    async def main() -> list[BaseException | None]:
        results = await asyncio.gather(
            *(_run_adk_agent(loop) for loop in loops), return_exceptions=True
        )
        return [r if isinstance(r, BaseException) else None for r in results]

    with (
        _tracing(provider, exporter) as (tp, exp),
        adk_telemetry(tp, schema=schema, capture=capture),
    ):
        outcomes = asyncio.run(main())
    return _finished(exp), outcomes
