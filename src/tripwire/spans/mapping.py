"""Span → event mapping: what real agent frameworks put on their OpenTelemetry spans.

One finished span becomes a :class:`~tripwire.core.events.ToolCall`, a
:class:`~tripwire.core.events.ModelCall`, a :class:`RunBoundary`, or nothing. The span
processor (in the agent's process) and ``tripwire replay`` (over OTLP files) both call
:func:`map_span`; neither needs to know which framework emitted the span.

Recognition goes by attributes, in this order (``docs/emitters.md``):

1. ``gen_ai.operation.name`` (GenAI semantic conventions): ``execute_tool`` → tool;
   ``chat``/``generate_content``/``text_completion`` → model; ``invoke_agent`` /
   ``invoke_workflow`` → run boundary;
2. ``openinference.span.kind``: ``TOOL`` / ``LLM`` / ``AGENT`` (and a *root* ``CHAIN``:
   OpenInference's LangChain instrumentation opens a LangGraph agent run with one; an ``AGENT``
   span of a LangGraph graph *node*, such as ``create_react_agent``'s model node, is a step,
   not a run);
3. ``traceloop.span.kind``: ``tool`` / ``llm`` / ``agent`` / ``workflow``;
4. ``ai.operationId`` (the Vercel AI SDK's own telemetry, ``ai`` 6): ``ai.toolCall`` → tool;
   ``ai.generateText.doGenerate`` / ``ai.streamText.doStream`` (and the object twins) → model;
   ``ai.generateText`` / ``ai.streamText`` → run boundary (the agent is its ``functionId``);
5. last resorts: a ``gen_ai.tool.name`` attribute alone, then the span name
   (``execute_tool {tool}``, ``{tool}.tool``).

The traps this module handles, so that its callers don't have to:

- arguments live in five places, two of them wrapped: the OpenLLMetry LangChain envelope
  ``{input_str, tags, metadata, inputs, kwargs}`` (only ``inputs`` is the call; the rest changes
  on every call) and the smolagents envelope ``{"args": [], "sanitize_inputs_outputs": …,
  "kwargs": {…}}``; OpenInference records a single string argument as bare text;
- arguments are opt-in everywhere: when none were recorded the result carries
  :data:`~tripwire.core.signature.ABSENT`, never ``{}`` (Google ADK's legacy schema writes
  ``"{}"`` for both args and result when capture is off: that pair is read as absent);
- LangChain results are a ToolMessage JSON whose ``tool_call_id``/``id`` change on every call:
  the result digest is taken of its ``content`` (and ``status``) only;
- token usage is counted only on model-call spans: ADK's legacy ``call_llm`` parent (same
  usage as its ``generate_content`` child), pydantic-ai's ``gen_ai.aggregated_usage.*`` and
  smolagents' ``llm.token_count.*`` on the run span are never model calls here.

Cost: classifying a span that is not an agent span is four key tests and, only for a name
holding ``tool``, two string prefix tests; mapping a plain GenAI tool span is three lookups and
one ``isdisjoint`` (:func:`_tool_call`). JSON is parsed only on tool spans, only when an envelope
or a ToolMessage is recognized by a substring test (after a one-character ``"_"`` test that
rules most arguments out at memory speed), and only below :data:`MAX_UNWRAP_BYTES`. This is the
only mapping: nothing in the compiled accelerator knows about spans.

Nothing here raises on span content: unknown or malformed shapes come back as ``None`` and
are counted in :class:`MappingStats`. Bump :data:`MAPPING_VERSION` whenever a change could
turn the same span into a different event (record it next to the normalizer version).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

import msgspec

from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER, Normalizer

__all__ = [
    "COST_ATTRIBUTES",
    "MAPPING_VERSION",
    "MAX_ERROR_TYPE",
    "MAX_TOOL_NAME",
    "MAX_UNWRAP_BYTES",
    "MappingStats",
    "RunBoundary",
    "SpanRole",
    "SpanView",
    "classify",
    "error_name",
    "map_model_span",
    "map_run_span",
    "map_span",
    "map_tool_span",
    "view_from_readable_span",
]

MAPPING_VERSION: Final = "m3"
"""Names the mapping rules. Bump when the same span could map to a different event.

m3: the Vercel AI SDK's spans (``ai.operationId``) are read: ``ai.toolCall`` is a tool call
(``ai.toolCall.name`` / ``.id`` / ``.args`` / ``.result``), ``ai.*.doGenerate`` /
``ai.*.doStream`` a model call, ``ai.generateText`` / ``ai.streamText`` a run boundary named by
``ai.telemetry.functionId`` (they were all ignored).

m2: an OpenInference ``AGENT`` span of a LangGraph graph node (``metadata`` names a
``langgraph_node``) is no run boundary; a model span's reported cost (:data:`COST_ATTRIBUTES`)
is its ``ModelCall.cost_usd``; tool names longer than :data:`MAX_TOOL_NAME` are clipped.
``tests/spans/test_golden.py`` pins what the mapping
makes of real frameworks' spans under this name."""

MAX_UNWRAP_BYTES: Final = 1024 * 1024
"""Envelopes and ToolMessages larger than this are not parsed: the raw text is used instead.

The trap: above the cap an OpenLLMetry envelope keeps its ever-changing ``langgraph_step``, so
two identical calls no longer have equal signatures. The cap bounds the cost of one span end.
"""

MAX_TOOL_NAME: Final = 256
"""Longer tool names are clipped to their first 200 characters, ``…`` and a 16-hex digest of
the whole name (distinct names stay distinct).

Why: a tool name is kept in every run's state, verdict, kill flag and budget counter; 3,000
finished traces with distinct 1 MB names once held 3 GB. Real tool names are short.
"""

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})


def _clip_name(tool: str) -> str:
    digest = hashlib.blake2b(tool.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{tool[:200]}…{digest}"


class SpanRole(str, Enum):
    """What a span is, for tripwire."""

    TOOL = "tool"
    """One tool execution."""
    MODEL = "model"
    """One model (LLM) call."""
    RUN = "run"
    """An agent or workflow run: the boundary loops and budgets are judged within."""
    OTHER = "other"
    """Anything else (framework internals, HTTP, database…): ignored."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanView:
    """A neutral view of one finished span, from the SDK or from an OTLP file.

    Build one with :func:`view_from_readable_span`, or by hand from decoded OTLP (the replay
    path). Only ``name`` and ``attributes`` decide the mapping; the ids and times are copied
    into the events.
    """

    trace_id: str
    """The trace id as 32 lowercase hex characters: loops are judged per trace."""
    span_id: str
    """The span id as 16 lowercase hex characters."""
    parent_span_id: str | None = None
    """The parent span's id (16 hex), or ``None`` for a root span."""
    name: str
    """The span name (a last-resort signal only: names differ across emitters)."""
    start_s: float | None = None
    """Start time in seconds since the epoch (``None`` if unknown)."""
    end_s: float | None = None
    """End time in seconds since the epoch (``None`` if unknown)."""
    status_error: bool = False
    """True when the span status is ERROR."""
    status_message: str | None = None
    """The status description, if any (never copied into tripwire's messages)."""
    exception_type: str | None = None
    """``exception.type`` of the span's first exception event, if the span failed."""
    attributes: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, hash=False)
    """The span attributes, not copied (the SDK hands out a read-only proxy)."""
    resource_attributes: Mapping[str, Any] | None = field(default=None, hash=False)
    """The resource attributes (``service.name``…), if the caller has them."""
    scope_name: str | None = None
    """The instrumentation scope name (which instrumentation emitted the span)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunBoundary:
    """A span that delimits an agent or workflow run.

    One run can be announced by nested boundaries (OpenLLMetry's ``invoke_agent looper`` wraps
    ``looper.workflow``; OpenInference's OpenAI Agents bridge opens ``Agent workflow`` then
    ``looper``): treat the outermost boundary of a trace (``parent_span_id is None`` or whose
    parent is not a boundary) as the run, and inner ones as the agent or a sub-agent.
    """

    agent: str | None
    """The agent or workflow name, when the emitter recorded one."""
    trace_id: str
    """The trace the run belongs to."""
    span_id: str
    """The boundary span's id."""
    parent_span_id: str | None
    """Its parent, ``None`` for the root of the trace."""
    start_s: float | None
    """When the run started."""
    end_s: float | None
    """When the run ended."""
    failed: bool
    """True when the boundary span's status is ERROR."""


@dataclass(slots=True)
class MappingStats:
    """Counts of what :func:`map_span` saw. Cheap, mutable, not locked.

    Increments from several threads may occasionally lose a count (plain ``+=`` under the
    GIL); these are diagnostics, not budgets.
    """

    tool_spans: int = 0
    """Spans mapped to a :class:`~tripwire.core.events.ToolCall`."""
    model_spans: int = 0
    """Spans mapped to a :class:`~tripwire.core.events.ModelCall`."""
    run_spans: int = 0
    """Spans mapped to a :class:`RunBoundary`."""
    other_spans: int = 0
    """Spans of no known agent shape, and model-like spans that are not calls (skipped)."""
    malformed: int = 0
    """Spans that looked like a tool call but could not be read (skipped)."""

    def as_dict(self) -> dict[str, int]:
        """The counters by name (for metrics and receipts)."""
        return {name: getattr(self, name) for name in self.__slots__}


# -- recognition ---------------------------------------------------------------------------

_GENAI_TOOL_OPS: Final = frozenset({"execute_tool"})
_GENAI_MODEL_OPS: Final = frozenset({"chat", "generate_content", "text_completion"})
_GENAI_RUN_OPS: Final = frozenset({"invoke_agent", "invoke_workflow"})
_TRACELOOP_ROLES: Final = {
    "tool": SpanRole.TOOL,
    "llm": SpanRole.MODEL,
    "agent": SpanRole.RUN,
    "workflow": SpanRole.RUN,
}
_AI_SDK_ROLES: Final = {
    "ai.toolCall": SpanRole.TOOL,
    "ai.generateText.doGenerate": SpanRole.MODEL,
    "ai.streamText.doStream": SpanRole.MODEL,
    "ai.generateObject.doGenerate": SpanRole.MODEL,
    "ai.streamObject.doStream": SpanRole.MODEL,
    "ai.generateText": SpanRole.RUN,
    "ai.streamText": SpanRole.RUN,
}
"""The Vercel AI SDK's ``ai.operationId`` values that are agent spans (docs/emitters.md). Its
run spans carry the *aggregate* ``ai.usage.*`` of every step: only the ``do*`` spans are calls.
``ai.generateObject`` / ``ai.streamObject`` (one structured answer, no tools) are no runs."""


def classify(
    attributes: Mapping[str, Any], name: str, parent_span_id: str | None = None
) -> SpanRole:
    """What a span is, from its attributes (and its name only as a last resort).

    Args:
        attributes: the span's attributes.
        name: the span's name.
        parent_span_id: the parent span id, or ``None`` for a root span (a root OpenInference
            ``CHAIN`` span is a LangGraph agent run).

    Returns:
        The role; :attr:`SpanRole.OTHER` for anything that is not an agent span. This is the
        hot path for every span: a few key tests, no parsing.
    """
    if (
        "gen_ai.operation.name" not in attributes
        and "openinference.span.kind" not in attributes
        and "traceloop.span.kind" not in attributes
    ):
        # Most spans (HTTP, database, framework internals): the AI SDK's own key, then the
        # last resorts.
        if "ai.operationId" in attributes:  # (an `in` test: half the cost of a .get call)
            sdk = attributes["ai.operationId"]
            return _AI_SDK_ROLES.get(sdk, SpanRole.OTHER) if isinstance(sdk, str) else SpanRole.OTHER
        if "gen_ai.tool.name" in attributes:
            return SpanRole.TOOL
        if (
            isinstance(name, str)
            and "tool" in name
            and (name.startswith("execute_tool ") or name.endswith(".tool"))
        ):
            return SpanRole.TOOL
        return SpanRole.OTHER
    get = attributes.get
    op = get("gen_ai.operation.name")
    if isinstance(op, str):  # a list or kvlist value is unhashable: no set test for it
        if op in _GENAI_TOOL_OPS:
            return SpanRole.TOOL
        if op in _GENAI_MODEL_OPS:
            return SpanRole.MODEL
        if op in _GENAI_RUN_OPS:
            return SpanRole.RUN
    oi = get("openinference.span.kind")
    if oi is not None:
        if oi == "TOOL":
            return SpanRole.TOOL
        if oi == "LLM":
            return SpanRole.MODEL
        if oi == "AGENT":
            # A LangGraph graph node that OpenInference labels AGENT (create_react_agent's model
            # node, once per step) is a step of the run, not an agent invocation: taken as a
            # boundary, each step would restart the loop window and no loop would ever show.
            return SpanRole.OTHER if _is_graph_node(get("metadata")) else SpanRole.RUN
        if oi == "CHAIN" and parent_span_id is None:
            return SpanRole.RUN
        return SpanRole.OTHER
    tl = get("traceloop.span.kind")
    if tl is not None:
        return _TRACELOOP_ROLES.get(tl, SpanRole.OTHER) if isinstance(tl, str) else SpanRole.OTHER
    if op is not None:
        return SpanRole.OTHER
    if "gen_ai.tool.name" in attributes:
        return SpanRole.TOOL
    if isinstance(name, str) and (name.startswith("execute_tool ") or name.endswith(".tool")):
        return SpanRole.TOOL
    return SpanRole.OTHER


_GRAPH_NODE_KEY: Final = '"langgraph_node"'
"""In OpenInference's ``metadata`` attribute (JSON text), the key a LangGraph node's span has."""


def _is_graph_node(metadata: Any) -> bool:
    """True when an OpenInference ``metadata`` attribute says the span is a LangGraph node.

    A substring test, no parsing: the attribute is JSON text written by the instrumentation
    (``{"langgraph_step": 1, "langgraph_node": "agent", …}``); an outermost agent invocation
    (``agent.invoke``) has no node, and neither has an OpenAI Agents or smolagents agent span.
    """
    return isinstance(metadata, str) and _GRAPH_NODE_KEY in metadata


# -- small readers (never raise) -------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


MAX_ERROR_TYPE: Final = 100
"""An error type (``error.type``, ``exception.type``) is kept to this many characters."""


def error_name(value: Any) -> str | None:
    """An error type as the service stores and shows it: text of at most
    :data:`MAX_ERROR_TYPE` characters, each control or other unprintable character replaced by
    ``?`` (a span's attribute is anyone's text: it must not reach a terminal, a log line or a
    page as escape sequences or forged lines)."""
    if not isinstance(value, str) or not value:
        return None
    text: str = value[:MAX_ERROR_TYPE]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else "?" for c in text)


def _int(value: Any) -> int | None:
    """A non-negative int from an attribute value (OTLP JSON sends ints as strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float):
        return int(value) if value.is_integer() and value >= 0 else None
    if isinstance(value, str) and value.isdecimal() and len(value) < 20:  # not "²": int() refuses it
        return int(value)
    return None


def _json(text: str) -> Any:
    """Parsed JSON, or ``None`` when the text is over the cap or not JSON."""
    if len(text) > MAX_UNWRAP_BYTES:
        return None
    try:
        return msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError, ValueError):
        return None


_NOT_SPECIFIED: Final = "<not specified>"  # ADK's placeholder for a missing call id / response


# -- tool spans ------------------------------------------------------------------------------


def _tool_name(attrs: Mapping[str, Any], name: str) -> str | None:
    get = attrs.get
    tool = _text(get("gen_ai.tool.name")) or _text(get("tool.name")) or _text(get("ai.toolCall.name"))
    if tool is not None:
        return tool
    tool = _text(get("traceloop.entity.name"))
    if tool is not None:
        return tool
    if not isinstance(name, str) or not name:
        return None
    if name.startswith("execute_tool "):
        return name[len("execute_tool ") :].strip() or None
    if name.endswith(".tool"):
        return name[: -len(".tool")] or None
    if name == "running tool":  # pydantic-ai legacy, without gen_ai.tool.name: no name left
        return None
    return name


_ENVELOPE_OPENINGS: Final = ('{"input_str"', '{"args"')
"""How the OpenLLMetry LangChain envelope and the smolagents one open, as emitted."""
_ENVELOPE_NEEDLES: Final = ('"input_str"', '"inputs"')
"""Keys that together mean an OpenLLMetry envelope whose keys were reordered."""
_INPUT_STR_KEY, _INPUTS_KEY = _ENVELOPE_NEEDLES


def _has_envelope_keys(text: str) -> bool:
    """True when ``text`` holds both ``"input_str"`` and ``"inputs"`` (an envelope, reordered).

    The ``"_"`` test first: a one-character search runs at memory speed, the two searches for
    the keys scan the whole text at about 0.4 ns a character, and text without an underscore
    cannot hold ``"input_str"``.
    """
    return "_" in text and _INPUT_STR_KEY in text and _INPUTS_KEY in text


def _unwrap_langchain_envelope(text: str) -> tuple[Any, str | None]:
    """(arguments, call id) from an OpenLLMetry LangChain envelope, or the text itself."""
    obj = _json(text)
    if not isinstance(obj, dict) or "inputs" not in obj:
        return text, None
    kwargs = obj.get("kwargs")
    call_id = _text(kwargs.get("tool_call_id")) if isinstance(kwargs, dict) else None
    return obj["inputs"], call_id


def _unwrap_smolagents(text: str) -> Any:
    obj = _json(text)
    if not isinstance(obj, dict):
        return text
    args = obj.get("args")
    kwargs = obj.get("kwargs")
    if not args:
        return kwargs if kwargs is not None else {}
    if not kwargs:
        return {"args": args}
    return {"args": args, "kwargs": kwargs}


def _arguments(attrs: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(arguments, call id found inside them) from every location docs/emitters.md lists."""
    get = attrs.get
    raw = get("gen_ai.tool.call.arguments")
    if raw is None:
        raw = get("ai.toolCall.args")  # the Vercel AI SDK (JSON text; absent with recordInputs off)
    if raw is None:
        raw = get("tool_arguments")  # pydantic-ai data format 1-2
    if raw is None:
        adk = get("gcp.vertex.agent.tool_call_args")
        if adk is not None:
            # ADK legacy writes "{}" for both args and response when content capture is off;
            # a response of "{}" is impossible with capture on (it is at least {"result": …}).
            if adk == "N/A" or (adk == "{}" and get("gcp.vertex.agent.tool_response") == "{}"):
                return ABSENT, None
            raw = adk
    if raw is None:
        raw = get("input.value")  # OpenInference (JSON, or a single string argument as text)
    if raw is None:
        raw = get("traceloop.entity.input")  # older OpenLLMetry: the same envelope
    if raw is None:
        return ABSENT, None
    if isinstance(raw, str):
        if raw.startswith('{"input_str"') or _has_envelope_keys(raw):
            return _unwrap_langchain_envelope(raw)
        if raw.startswith('{"args"') and '"sanitize_inputs_outputs"' in raw:
            return _unwrap_smolagents(raw), None
        return raw, None
    if isinstance(raw, (bytes, int, float, bool)):
        return raw, None
    if isinstance(raw, (tuple, list)):  # a sequence attribute: keep it, canonicalized as JSON
        return list(raw), None
    return ABSENT, None


_TOOL_MESSAGE_KEY: Final = '"tool_call_id"'
"""In a result, a LangChain ToolMessage's key (with an underscore, as every wrapping has)."""


def _unwrap_result(value: Any) -> tuple[Any, str | None]:
    """(the stable part of a result, call id found in it) — unwraps LangChain ToolMessages."""
    if not isinstance(value, str) or "_" not in value or _TOOL_MESSAGE_KEY not in value:
        return value, None  # (the "_" test: see _has_envelope_keys)
    obj = _json(value)
    if not isinstance(obj, dict):
        return value, None
    msg: Any = None
    data = obj.get("data")
    if obj.get("type") == "tool" and isinstance(data, dict):  # OpenInference: message_to_dict
        msg = data
    else:
        out = obj.get("output", obj)  # OpenLLMetry: {"output": {lc constructor}, "kwargs": …}
        if isinstance(out, dict) and isinstance(out.get("kwargs"), dict) and out.get("lc"):
            msg = out["kwargs"]
        elif isinstance(out, dict) and "content" in out:
            msg = out
    if not isinstance(msg, dict) or "content" not in msg:
        return value, None
    stable: dict[str, Any] = {"content": msg.get("content")}
    if msg.get("status") not in (None, "success"):
        stable["status"] = msg.get("status")
    if msg.get("artifact") is not None:
        stable["artifact"] = msg.get("artifact")
    return stable, _text(msg.get("tool_call_id"))


_ADK_RETRY_RESPONSE: Final = "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"


def _error_in_result(value: Any) -> tuple[str | None, int | None]:
    """(error type, attempt) when a result reports a failure the span status does not.

    ADK's ReflectAndRetryToolPlugin leaves the span UNSET and returns
    ``{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN", "error_type": …,
    "retry_count": n}``; a LangChain ToolMessage carries ``status: "error"``.
    """
    if isinstance(value, str):
        if "_" not in value or _ADK_RETRY_RESPONSE not in value:
            return None, None
        value = _json(value)
    if not isinstance(value, dict):
        return None, None
    if value.get("status") == "error":
        return "ToolError", None
    if value.get("response_type") == _ADK_RETRY_RESPONSE:
        return error_name(value.get("error_type")) or "ToolError", _int(value.get("retry_count"))
    return None, None


_RESULT_KEYS: Final = (
    "gen_ai.tool.call.result",
    "ai.toolCall.result",
    "output.value",
    "tool_response",
    "gcp.vertex.agent.tool_response",
    "traceloop.entity.output",
)
"""Where emitters put a tool's result, in the order they are tried."""

_RARE_TOOL_KEYS: Final = frozenset(
    {*_RESULT_KEYS, "error.type", "pydantic_ai.tool.retry.attempt", "pydantic_ai.tool.retry.cause"}
)
"""The result, error and retry keys :func:`_tool_call` reads: one ``isdisjoint`` test (the
attribute keys are iterated in C) skips all nine lookups on a span that has none of them."""


def map_tool_span(view: SpanView, normalizer: Normalizer = DEFAULT_NORMALIZER) -> ToolCall | None:
    """The tool call a tool span records, or ``None`` when no tool name can be found.

    Args:
        view: a span :func:`classify` called :attr:`SpanRole.TOOL` (not re-checked).
        normalizer: digests the result with :meth:`~tripwire.core.signature.Normalizer.result_digest`
            (normalized like arguments, digits masked).

    Returns:
        A :class:`~tripwire.core.events.ToolCall` whose ``arguments`` are raw (a JSON string,
        text, or an unwrapped mapping) or :data:`~tripwire.core.signature.ABSENT`;
        normalization is left to the signature.
    """
    return _tool_call(
        view.attributes,
        view.name,
        view.start_s,
        view.end_s,
        (error_name(view.exception_type) or "") if view.status_error else None,
        normalizer,
    )


def _tool_call(
    attrs: Mapping[str, Any],
    name: str,
    start_s: float | None,
    end_s: float | None,
    failure: str | None,
    normalizer: Normalizer = DEFAULT_NORMALIZER,
) -> ToolCall | None:
    """:func:`map_tool_span` from the span's parts, without a :class:`SpanView`.

    For callers that hold a span of their own (the span processor): ``failure`` is ``None``
    when the span's status is not ERROR, else the type of its first exception event, or
    ``""`` when it has none.

    The common case (a GenAI tool span: name, string arguments, call id, no result, error or
    retry attributes) takes three lookups and one ``isdisjoint``; anything else takes the
    general path, with the same results.
    """
    get = attrs.get
    tool = get("gen_ai.tool.name")
    if not isinstance(tool, str) or not tool:
        tool = _tool_name(attrs, name)
        if tool is None:
            return None
    if len(tool) > MAX_TOOL_NAME:
        tool = _clip_name(tool)
    raw = get("gen_ai.tool.call.arguments")
    call_id: str | None
    if type(raw) is str and (
        # Both envelopes need an underscore ("input_str", "sanitize_inputs_outputs"): text
        # without one is plain arguments (see _has_envelope_keys); else the full tests.
        "_" not in raw
        or not (raw.startswith(_ENVELOPE_OPENINGS) or _has_envelope_keys(raw))
    ):
        arguments: Any = raw  # what _arguments() returns for plain string arguments
        call_id = None
    else:
        arguments, call_id = _arguments(attrs)
    if call_id is None:
        call_id = get("gen_ai.tool.call.id")
        if call_id is None:
            call_id = get("ai.toolCall.id")  # the Vercel AI SDK
        if not isinstance(call_id, str) or not call_id or call_id == _NOT_SPECIFIED:
            call_id = None
    else:
        outer = get("gen_ai.tool.call.id")
        if outer is not None:
            call_id = _text(outer) or call_id
        if call_id == _NOT_SPECIFIED:
            call_id = None

    result_digest: str | None = None
    error_type: str | None = None
    attempt: int | None = None
    retryable: bool | None = None
    if _RARE_TOOL_KEYS.isdisjoint(attrs):
        # No result, error or retry attribute: only the span's status can say it failed.
        if failure is not None:
            error_type = failure or "error"
    else:
        result: Any = None
        for key in _RESULT_KEYS:
            result = get(key)
            if result is not None:
                break
        if result is not None:
            if type(result) is str and "_" not in result:
                # Neither a ToolMessage nor an ADK retry response (both need an underscore):
                # what _unwrap_result() and _error_in_result() return for it, without the calls.
                if not (result == "{}" and arguments is ABSENT):
                    result_digest = normalizer.result_digest(result)
            else:
                stable, result_call_id = _unwrap_result(result)
                if call_id is None:
                    call_id = result_call_id
                error_type, attempt = _error_in_result(stable)
                if not (isinstance(stable, str) and stable == "{}" and arguments is ABSENT):
                    result_digest = normalizer.result_digest(stable)

        explicit = get("error.type")
        if explicit is not None:
            explicit = error_name(explicit)
        if explicit is not None:
            error_type = explicit
        elif failure is not None:
            error_type = failure or error_type or "error"

        retry_attempt = get("pydantic_ai.tool.retry.attempt")
        if retry_attempt is not None:
            retry_attempt = _int(retry_attempt)
        if retry_attempt is not None:
            attempt = retry_attempt
        if get("pydantic_ai.tool.retry.cause") is not None:
            # pydantic-ai records attempt/max_retries only while the retry budget lasts; a
            # cause alone means the failure ends the run instead of being retried.
            retryable = retry_attempt is not None

    return ToolCall(
        tool=tool,
        arguments=arguments,
        call_id=call_id,
        start_s=start_s,
        end_s=end_s,
        error_type=error_type,
        retryable=retryable,
        attempt=attempt,
        result_digest=result_digest,
    )


# -- model spans -----------------------------------------------------------------------------


def _first_int(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = attrs.get(key)
        if value is not None:
            parsed = _int(value)
            if parsed is not None:
                return parsed
    return None


def _first_text(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = _text(attrs.get(key))
        if value is not None:
            return value
    return None


_INPUT_KEYS: Final = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.token_count.prompt",
)
_OUTPUT_KEYS: Final = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.token_count.completion",
)
_MODEL_KEYS: Final = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name")
_PROVIDER_KEYS: Final = ("gen_ai.provider.name", "gen_ai.system", "llm.provider", "llm.system")


COST_ATTRIBUTES: Final = ("operation.cost", "llm.cost.total", "gen_ai.usage.cost")
"""Span attributes read as a model call's reported cost in USD (pydantic-ai, OpenInference,
Langfuse-style), first present wins; without one (or with an unusable one) ``cost_usd`` is
``None`` and the cost comes from the price table."""


def _cost(attrs: Mapping[str, Any]) -> float | None:
    for key in COST_ATTRIBUTES:
        value = attrs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        try:
            cost = float(value)
        except OverflowError:
            return None
        return cost if math.isfinite(cost) and cost >= 0 else None
    return None


def map_model_span(view: SpanView) -> ModelCall | None:
    """The usage of one model call, from a span :func:`classify` called :attr:`SpanRole.MODEL`.

    Counted once per call by construction: only model-call spans are read. ADK's legacy
    ``call_llm`` span (no ``gen_ai.operation.name``; the same usage as its
    ``generate_content`` child) and run spans carrying aggregates (pydantic-ai's
    ``gen_ai.aggregated_usage.*``, smolagents' ``llm.token_count.*`` on the ``AGENT`` span) are
    never model calls. A model span without usage (the OpenAI Agents SDK through OpenLLMetry
    records usage only for Responses-API calls) gives a call with zero tokens.

    Returns ``None`` only when ``view`` is ADK's legacy ``call_llm`` span.
    """
    attrs = view.attributes
    if view.name == "call_llm" and attrs.get("gen_ai.system") == "gcp.vertex.agent":
        return None
    return ModelCall(
        model=_first_text(attrs, _MODEL_KEYS),
        provider=_first_text(attrs, _PROVIDER_KEYS),
        input_tokens=_first_int(attrs, _INPUT_KEYS) or 0,
        output_tokens=_first_int(attrs, _OUTPUT_KEYS) or 0,
        cost_usd=_cost(attrs),
        call_id=_text(attrs.get("gen_ai.response.id")),
        start_s=view.start_s,
        end_s=view.end_s,
    )


# -- run boundaries --------------------------------------------------------------------------


def map_run_span(view: SpanView) -> RunBoundary:
    """The run boundary a span :func:`classify` called :attr:`SpanRole.RUN` announces."""
    attrs = view.attributes
    agent = (
        _text(attrs.get("gen_ai.agent.name"))
        or _text(attrs.get("agent.name"))
        or _text(attrs.get("gen_ai.workflow.name"))
        or _text(attrs.get("traceloop.workflow.name"))
        or _text(attrs.get("ai.telemetry.functionId"))  # the Vercel AI SDK's functionId
    )
    if agent is None and isinstance(view.name, str):
        name = view.name
        for prefix in ("invoke_agent ", "invoke_workflow "):
            if name.startswith(prefix):
                agent = name[len(prefix) :].strip() or None
                break
        else:
            if name.endswith((".workflow", ".agent")):
                agent = name.rsplit(".", 1)[0] or None
            elif name.endswith(" run"):
                agent = name[: -len(" run")] or None
            else:
                agent = name or None
    return RunBoundary(
        agent=agent,
        trace_id=view.trace_id,
        span_id=view.span_id,
        parent_span_id=view.parent_span_id,
        start_s=view.start_s,
        end_s=view.end_s,
        failed=view.status_error,
    )


# -- the single entry ------------------------------------------------------------------------


def map_span(
    view: SpanView,
    normalizer: Normalizer = DEFAULT_NORMALIZER,
    stats: MappingStats | None = None,
) -> ToolCall | ModelCall | RunBoundary | None:
    """The event one finished span records, or ``None`` to skip it.

    Args:
        view: the span.
        normalizer: digests tool results (see :func:`map_tool_span`).
        stats: counters to update, if given.

    Returns:
        A :class:`~tripwire.core.events.ToolCall`, a
        :class:`~tripwire.core.events.ModelCall`, a :class:`RunBoundary`, or ``None`` for spans
        of no agent shape and for malformed ones (both counted in ``stats``). Never raises for
        any span content: wrong attribute types, non-JSON or huge arguments all have defined
        results.
    """
    attrs = view.attributes
    event: ToolCall | ModelCall | RunBoundary | None
    if type(attrs) is dict:
        if attrs.get("gen_ai.operation.name") == "execute_tool":
            # The common span (a GenAI tool span): what classify() and map_tool_span() would
            # do, without their two calls; classify() tests this key first and ends there.
            return _counted_tool(
                _tool_call(
                    attrs,
                    view.name,
                    view.start_s,
                    view.end_s,
                    (error_name(view.exception_type) or "") if view.status_error else None,
                    normalizer,
                ),
                stats,
            )
    elif not isinstance(attrs, Mapping):
        if stats is not None:
            stats.malformed += 1
        return None
    role = classify(attrs, view.name, view.parent_span_id)
    if role is SpanRole.OTHER:
        if stats is not None:
            stats.other_spans += 1
        return None
    if role is SpanRole.TOOL:
        return _counted_tool(map_tool_span(view, normalizer), stats)
    if role is SpanRole.MODEL:
        event = map_model_span(view)
        if stats is not None:
            if event is None:
                stats.other_spans += 1
            else:
                stats.model_spans += 1
        return event
    event = map_run_span(view)
    if stats is not None:
        stats.run_spans += 1
    return event


def _counted_tool(event: ToolCall | None, stats: MappingStats | None) -> ToolCall | None:
    """``event``, a tool span's mapping, counted in ``stats`` (``None``: a malformed span)."""
    if stats is not None:
        if event is None:
            stats.malformed += 1
        else:
            stats.tool_spans += 1
    return event


# -- from the SDK ----------------------------------------------------------------------------


def view_from_readable_span(span: Any) -> SpanView:
    """A :class:`SpanView` of an OpenTelemetry SDK ``ReadableSpan`` (duck-typed, no SDK import).

    Cheap: the attributes are the SDK's read-only proxy (not copied); events are read only
    when the span failed, to find the exception type.
    """
    ctx = span.context
    parent = span.parent
    status = span.status
    status_error = getattr(getattr(status, "status_code", None), "name", None) == "ERROR"
    exception_type: str | None = None
    if status_error:
        for event in span.events:
            if event.name == "exception":
                exception_type = error_name((event.attributes or _EMPTY).get("exception.type"))
                break
    start = span.start_time
    end = span.end_time
    scope = span.instrumentation_scope
    resource = span.resource
    return SpanView(
        trace_id=f"{ctx.trace_id:032x}",
        span_id=f"{ctx.span_id:016x}",
        parent_span_id=f"{parent.span_id:016x}" if parent is not None else None,
        name=span.name,
        start_s=start / 1e9 if start is not None else None,
        end_s=end / 1e9 if end is not None else None,
        status_error=status_error,
        status_message=getattr(status, "description", None),
        exception_type=exception_type,
        attributes=span.attributes or _EMPTY,
        resource_attributes=resource.attributes if resource is not None else None,
        scope_name=scope.name if scope is not None else None,
    )
