"""A frozen copy of the m1 tool-span mapping (``classify``, ``map_tool_span``), before the
fast paths: ``test_fast_paths.py`` checks the optimized mapping against it on random spans.

Copied verbatim from ``tripwire/otel/conventions.py`` at mapping version ``m1``; do not edit
(bump ``MAPPING_VERSION`` and replace this file when the mapping changes on purpose).
"""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from tripwire.core.events import ToolCall
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER, Normalizer
from tripwire.otel.conventions import SpanRole, SpanView

MAX_UNWRAP_BYTES: Final = 1024 * 1024

_GENAI_TOOL_OPS: Final = frozenset({"execute_tool"})
_GENAI_MODEL_OPS: Final = frozenset({"chat", "generate_content", "text_completion"})
_GENAI_RUN_OPS: Final = frozenset({"invoke_agent", "invoke_workflow"})
_TRACELOOP_ROLES: Final = {
    "tool": SpanRole.TOOL,
    "llm": SpanRole.MODEL,
    "agent": SpanRole.RUN,
    "workflow": SpanRole.RUN,
}


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
        hot path for every span: a few dict lookups, no parsing.
    """
    get = attributes.get
    op = get("gen_ai.operation.name")
    if op is not None:
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
        if oi == "AGENT" or (oi == "CHAIN" and parent_span_id is None):
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


# -- small readers (never raise) -------------------------------------------------------------


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


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
    tool = _text(get("gen_ai.tool.name")) or _text(get("tool.name"))
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
    """(arguments, call id found inside them) from every location EMITTERS.md lists."""
    get = attrs.get
    raw = get("gen_ai.tool.call.arguments")
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
        head = raw[:64]
        if head.startswith('{"input_str"') or ('"input_str"' in raw and '"inputs"' in raw):
            return _unwrap_langchain_envelope(raw)
        if head.startswith('{"args"') and '"sanitize_inputs_outputs"' in raw:
            return _unwrap_smolagents(raw), None
        return raw, None
    if isinstance(raw, (bytes, int, float, bool)):
        return raw, None
    if isinstance(raw, (tuple, list)):  # a sequence attribute: keep it, canonicalized as JSON
        return list(raw), None
    return ABSENT, None


def _unwrap_result(value: Any) -> tuple[Any, str | None]:
    """(the stable part of a result, call id found in it) — unwraps LangChain ToolMessages."""
    if not isinstance(value, str) or '"tool_call_id"' not in value:
        return value, None
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
        if _ADK_RETRY_RESPONSE not in value:
            return None, None
        value = _json(value)
    if not isinstance(value, dict):
        return None, None
    if value.get("status") == "error":
        return "ToolError", None
    if value.get("response_type") == _ADK_RETRY_RESPONSE:
        return _text(value.get("error_type")) or "ToolError", _int(value.get("retry_count"))
    return None, None


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
    attrs = view.attributes
    tool = _tool_name(attrs, view.name)
    if tool is None:
        return None
    get = attrs.get
    arguments, call_id = _arguments(attrs)
    if call_id is None:
        call_id = _text(get("gen_ai.tool.call.id"))
    elif get("gen_ai.tool.call.id") is not None:
        call_id = _text(get("gen_ai.tool.call.id")) or call_id
    if call_id == _NOT_SPECIFIED:
        call_id = None

    result: Any = None
    for key in (
        "gen_ai.tool.call.result",
        "output.value",
        "tool_response",
        "gcp.vertex.agent.tool_response",
        "traceloop.entity.output",
    ):
        result = get(key)
        if result is not None:
            break
    result_digest: str | None = None
    error_type: str | None = None
    attempt: int | None = None
    if result is not None:
        stable, result_call_id = _unwrap_result(result)
        if call_id is None:
            call_id = result_call_id
        error_type, attempt = _error_in_result(stable)
        if not (isinstance(stable, str) and stable == "{}" and arguments is ABSENT):
            result_digest = normalizer.result_digest(stable)

    explicit = _text(get("error.type"))
    if explicit is not None:
        error_type = explicit
    elif view.status_error:
        error_type = view.exception_type or error_type or "error"

    retry_attempt = _int(get("pydantic_ai.tool.retry.attempt"))
    if retry_attempt is not None:
        attempt = retry_attempt
    retryable: bool | None = None
    if get("pydantic_ai.tool.retry.cause") is not None:
        # pydantic-ai records attempt/max_retries only while the retry budget lasts; a cause
        # alone means the failure ends the run instead of being retried.
        retryable = retry_attempt is not None

    return ToolCall(
        tool=tool,
        arguments=arguments,
        call_id=call_id,
        start_s=view.start_s,
        end_s=view.end_s,
        error_type=error_type,
        retryable=retryable,
        attempt=attempt,
        result_digest=result_digest,
    )

