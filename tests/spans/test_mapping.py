"""The span → event mapping, on hand-written spans shaped like each emitter's (docs/emitters.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER, signature_of
from tripwire.spans.mapping import (
    MAPPING_VERSION,
    MappingStats,
    RunBoundary,
    SpanRole,
    SpanView,
    classify,
    map_model_span,
    map_span,
    map_tool_span,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"


def view(name: str, attrs: dict[str, Any], **kw: Any) -> SpanView:
    kw.setdefault("parent_span_id", "00f067aa0ba902b7")
    return SpanView(
        trace_id=TRACE, span_id="b7ad6b7169203331", name=name, start_s=1.0, end_s=1.5,
        attributes=attrs, **kw,
    )  # fmt: skip


def tool(name: str, attrs: dict[str, Any], **kw: Any) -> ToolCall:
    event = map_span(view(name, attrs, **kw))
    assert isinstance(event, ToolCall), event
    return event


def sig(call: ToolCall) -> Any:
    return signature_of(call.tool, call.arguments)


def langgraph_envelope(step: int, call_id: str, query: str = "refund policy") -> str:
    """OpenLLMetry's LangChain envelope, as opentelemetry-instrumentation-langchain 0.62 writes it."""
    ns = f"tools:{step:08x}-0000-0000-0000-000000000000"
    return json.dumps(
        {
            "input_str": str({"query": query}),
            "tags": ["seq:step:1"],
            "metadata": {
                "lc_agent_name": "looper",
                "langgraph_step": step,
                "langgraph_node": "tools",
                "langgraph_checkpoint_ns": ns,
                "checkpoint_ns": ns,
            },
            "inputs": {"query": query},
            "kwargs": {"color": "green", "name": None, "tool_call_id": call_id},
        }
    )


def langchain_tool_message_oi(call_id: str, content: str = "no results") -> str:
    """A ToolMessage as OpenInference's LangChain instrumentation records ``output.value``."""
    return json.dumps(
        {
            "type": "tool",
            "data": {
                "content": content, "additional_kwargs": {}, "response_metadata": {},
                "type": "tool", "name": "search_docs", "id": None, "tool_call_id": call_id,
                "artifact": None, "status": "success",
            },
        }
    )  # fmt: skip


def langchain_tool_message_ol(call_id: str, content: str = "no results") -> str:
    """A ToolMessage as OpenLLMetry's LangChain instrumentation records the result."""
    return json.dumps(
        {
            "output": {
                "lc": 1, "type": "constructor",
                "id": ["langchain", "schema", "messages", "ToolMessage"],
                "kwargs": {"content": content, "type": "tool", "name": "search_docs",
                           "tool_call_id": call_id, "status": "success"},
            },
            "kwargs": {"tags": ["seq:step:1"], "color": "green", "name": "search_docs"},
        }
    )  # fmt: skip


# -- one test per row of the docs/emitters.md table -----------------------------------------------


def test_genai_conventions_tool_span() -> None:
    call = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": "pyd_ai_1",
            "gen_ai.tool.call.arguments": '{"query":"refund policy"}',
            "gen_ai.tool.call.result": "no results",
        },
    )
    assert call.tool == "search_docs"
    assert call.arguments == '{"query":"refund policy"}'
    assert call.call_id == "pyd_ai_1"
    assert (call.start_s, call.end_s) == (1.0, 1.5)
    assert call.error_type is None
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest("no results")
    assert sig(call) == signature_of("search_docs", {"query": "refund policy"})


def test_genai_model_span_counts_usage() -> None:
    event = map_span(
        view(
            "chat gpt-5",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-5",
                "gen_ai.response.model": "gpt-5-2026-01-01",
                "gen_ai.response.id": "resp_1",
                "gen_ai.usage.input_tokens": 51,
                "gen_ai.usage.output_tokens": 6,
            },
        )
    )
    assert event == ModelCall(
        model="gpt-5-2026-01-01", provider="openai", input_tokens=51, output_tokens=6,
        call_id="resp_1", start_s=1.0, end_s=1.5,
    )  # fmt: skip


@pytest.mark.parametrize("op", ["chat", "generate_content", "text_completion"])
def test_every_genai_model_operation_is_a_model_span(op: str) -> None:
    assert classify({"gen_ai.operation.name": op}, "x") is SpanRole.MODEL


def test_legacy_genai_usage_names() -> None:
    event = map_span(
        view(
            "chat",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.system": "openai",
                "gen_ai.usage.prompt_tokens": 7,
                "gen_ai.usage.completion_tokens": 2,
            },
        )
    )
    assert isinstance(event, ModelCall)
    assert (event.provider, event.input_tokens, event.output_tokens) == ("openai", 7, 2)


def test_pydantic_ai_legacy_format() -> None:
    call = tool(
        "running tool",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": "pyd_ai_9",
            "tool_arguments": '{"query":"refund policy"}',
            "tool_response": "no results",
            "logfire.msg": "running tool: search_docs",
        },
    )
    assert call.tool == "search_docs"
    assert call.arguments == '{"query":"refund policy"}'
    assert call.call_id == "pyd_ai_9"
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest("no results")


def test_pydantic_ai_format_1_without_operation_name() -> None:
    # Data format 1 had neither gen_ai.operation.name nor a telling span name.
    call = tool("running tool", {"gen_ai.tool.name": "search_docs", "tool_arguments": "{}"})
    assert (call.tool, call.arguments) == ("search_docs", "{}")


def test_openllmetry_langchain_envelope_is_unwrapped() -> None:
    call = tool(
        "execute_tool search_docs",
        {
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "search_docs",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.arguments": langgraph_envelope(2, "call_0"),
            "gen_ai.tool.call.result": langchain_tool_message_ol("call_0"),
        },
    )
    assert call.arguments == {"query": "refund policy"}
    assert call.call_id == "call_0"
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest({"content": "no results"})


def test_envelope_unwrapping_gives_equal_signatures_across_langgraph_steps() -> None:
    calls = [
        tool(
            "search_docs.tool",
            {
                "traceloop.span.kind": "tool",
                "traceloop.entity.name": "search_docs",
                "traceloop.entity.input": langgraph_envelope(step, f"call_{step}"),
                "traceloop.entity.output": langchain_tool_message_ol(f"call_{step}"),
            },
        )
        for step in (2, 4)
    ]
    assert [c.tool for c in calls] == ["search_docs", "search_docs"]
    assert [c.call_id for c in calls] == ["call_2", "call_4"]
    assert sig(calls[0]) == sig(calls[1])
    assert calls[0].result_digest == calls[1].result_digest
    # ...while the raw envelopes differ (the step, the namespace, the call id).
    assert signature_of("search_docs", langgraph_envelope(2, "call_2")) != signature_of(
        "search_docs", langgraph_envelope(4, "call_4")
    )
    other = tool("x", {"traceloop.span.kind": "tool", "traceloop.entity.name": "search_docs",
                       "traceloop.entity.input": langgraph_envelope(6, "call_6", "shipping")})  # fmt: skip
    assert sig(other) != sig(calls[0])


def test_openllmetry_openai_agents_bridge() -> None:
    call = tool(
        "search_docs.tool",
        {
            "traceloop.span.kind": "tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.call.arguments": '{"query":"refund policy"}',
            "gen_ai.tool.call.result": "no results",
        },
    )
    assert (call.tool, call.arguments, call.call_id) == (
        "search_docs",
        '{"query":"refund policy"}',
        None,
    )


def test_openllmetry_model_span_without_usage_counts_zero_tokens() -> None:
    event = map_span(
        view("openai.response", {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai"})
    )
    assert event == ModelCall(provider="openai", start_s=1.0, end_s=1.5)


def test_openinference_json_arguments_and_token_counts() -> None:
    call = tool(
        "search_docs",
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "search_docs",
            "input.value": '{"query":"refund policy"}',
            "input.mime_type": "application/json",
            "output.value": "no results",
        },
    )
    assert (call.tool, call.arguments, call.call_id) == (
        "search_docs",
        '{"query":"refund policy"}',
        None,
    )
    model = map_span(
        view(
            "generation",
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-5",
                "llm.system": "openai",
                "llm.token_count.prompt": 10,
                "llm.token_count.completion": 3,
                "llm.token_count.total": 13,
            },
        )
    )
    assert model == ModelCall(
        model="gpt-5", provider="openai", input_tokens=10, output_tokens=3, start_s=1.0, end_s=1.5
    )


def test_openinference_bare_string_argument() -> None:
    calls = [
        tool(
            "search_docs",
            {
                "openinference.span.kind": "TOOL",
                "tool.name": "search_docs",
                "input.value": "refund policy",
                "output.value": langchain_tool_message_oi(f"call_{i}"),
            },
        )
        for i in range(2)
    ]
    assert calls[0].arguments == "refund policy"
    assert sig(calls[0]) == sig(calls[1])
    assert not sig(calls[0]).name_only
    assert sig(calls[0]) != signature_of("search_docs", "shipping policy")
    # The ToolMessage gives the call id OpenInference does not record elsewhere, and its
    # changing ids do not reach the digest.
    assert [c.call_id for c in calls] == ["call_0", "call_1"]
    assert calls[0].result_digest == calls[1].result_digest
    assert calls[0].result_digest == DEFAULT_NORMALIZER.result_digest({"content": "no results"})


def test_smolagents_kwargs_are_unwrapped() -> None:
    call = tool(
        "SimpleTool",
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "search_docs",
            "input.value": '{"args": [], "sanitize_inputs_outputs": true, "kwargs": {"query": "refund policy"}}',
            "output.value": "no results",
        },
    )
    assert call.arguments == {"query": "refund policy"}
    assert sig(call) == signature_of("search_docs", '{"query": "refund policy"}')


def test_smolagents_positional_args_are_kept() -> None:
    call = tool(
        "SimpleTool",
        {
            "openinference.span.kind": "TOOL",
            "tool.name": "search_docs",
            "input.value": '{"args": ["refund policy"], "sanitize_inputs_outputs": false, "kwargs": {}}',
        },
    )
    assert call.arguments == {"args": ["refund policy"]}


def test_adk_semconv_schema() -> None:
    call = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.type": "FunctionTool",
            "gen_ai.tool.call.id": "adk-1",
            "gen_ai.tool.call.arguments": '{"query": "refund policy"}',
            "gen_ai.tool.call.result": '{"result": "no results"}',
        },
    )
    assert (call.tool, call.call_id) == ("search_docs", "adk-1")
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest('{"result": "no results"}')


def test_adk_legacy_schema() -> None:
    call = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": "adk-2",
            "gcp.vertex.agent.llm_request": "{}",
            "gcp.vertex.agent.llm_response": "{}",
            "gcp.vertex.agent.tool_call_args": '{"query": "refund policy"}',
            "gcp.vertex.agent.tool_response": '{"result": "no results"}',
        },
    )
    assert call.arguments == '{"query": "refund policy"}'
    assert call.call_id == "adk-2"
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest('{"result": "no results"}')


def test_adk_legacy_capture_off_is_absent_not_empty() -> None:
    call = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.id": "<not specified>",
            "gcp.vertex.agent.tool_call_args": "{}",
            "gcp.vertex.agent.tool_response": "{}",
        },
    )
    assert call.arguments is ABSENT
    assert call.call_id is None
    assert call.result_digest is None
    # A tool that really takes no arguments still has them recorded as {}.
    noargs = tool(
        "execute_tool now",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "now",
            "gcp.vertex.agent.tool_call_args": "{}",
            "gcp.vertex.agent.tool_response": '{"result": "12:00"}',
        },
    )
    assert noargs.arguments == "{}"


def test_adk_legacy_usage_on_call_llm_and_generate_content_is_counted_once() -> None:
    usage = {"gen_ai.usage.input_tokens": 120, "gen_ai.usage.output_tokens": 8}
    call_llm = view(
        "call_llm",
        {"gen_ai.system": "gcp.vertex.agent", "gen_ai.request.model": "gemini-2.5-flash", **usage},
    )
    child = view(
        "generate_content gemini-2.5-flash",
        {"gen_ai.operation.name": "generate_content", "gen_ai.request.model": "gemini-2.5-flash",
         "gen_ai.system": "gemini", **usage},
    )  # fmt: skip
    stats = MappingStats()
    events = [map_span(v, stats=stats) for v in (call_llm, child)]
    models = [e for e in events if isinstance(e, ModelCall)]
    assert len(models) == 1
    assert sum(m.input_tokens for m in models) == 120
    assert stats.model_spans == 1
    # Even if an emitter marks call_llm as a model span, it is not counted.
    marked = view("call_llm", {**call_llm.attributes, "gen_ai.operation.name": "chat"})
    assert map_model_span(marked) is None


# -- pitfalls ----------------------------------------------------------------------------------


def test_no_arguments_recorded_is_absent() -> None:
    call = tool(
        "execute_tool search_docs",
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs"},
    )
    assert call.arguments is ABSENT
    assert sig(call).name_only
    assert call.result_digest is None


def test_error_status_and_error_type() -> None:
    failed = tool(
        "execute_tool search_docs",
        {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs"},
        status_error=True,
        exception_type="TimeoutError",
    )
    assert failed.error_type == "TimeoutError"
    assert failed.failed
    explicit = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "s",
            "error.type": "HTTP_ERROR",
        },
        status_error=True,
        exception_type="RuntimeError",
    )
    assert explicit.error_type == "HTTP_ERROR"
    bare = tool("execute_tool s", {"gen_ai.operation.name": "execute_tool"}, status_error=True)
    assert (bare.tool, bare.error_type) == ("s", "error")


def test_pydantic_ai_retry_attributes() -> None:
    attrs = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search_docs",
        "gen_ai.tool.call.arguments": '{"query":"x"}',
        "pydantic_ai.tool.retry.cause": "model_retry",
        "pydantic_ai.tool.retry.attempt": 2,
        "pydantic_ai.tool.retry.max_retries": 3,
    }
    call = tool("execute_tool search_docs", attrs, status_error=True, exception_type="ModelRetry")
    assert (call.error_type, call.attempt, call.retryable) == ("ModelRetry", 2, True)
    # Past the budget pydantic-ai records the cause alone: the run ends, no retry follows.
    last = {k: v for k, v in attrs.items() if "attempt" not in k and "max_retries" not in k}
    call = tool("execute_tool search_docs", last, status_error=True, exception_type="ModelRetry")
    assert (call.attempt, call.retryable) == (None, False)


def test_adk_retry_plugin_error_inside_result_with_status_unset() -> None:
    response = {
        "response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN",
        "error_type": "ValueError",
        "error_details": "bad query",
        "retry_count": 1,
        "reflection_guidance": "...",
    }
    call = tool(
        "execute_tool search_docs",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.arguments": '{"query": "x"}',
            "gen_ai.tool.call.result": json.dumps(response),
        },
    )
    assert (call.error_type, call.attempt) == ("ValueError", 1)


def test_langchain_tool_message_with_error_status() -> None:
    msg = json.loads(langchain_tool_message_oi("call_1", "Error: boom"))
    msg["data"]["status"] = "error"
    call = tool(
        "search_docs",
        {"openinference.span.kind": "TOOL", "tool.name": "search_docs",
         "input.value": "x", "output.value": json.dumps(msg)},
    )  # fmt: skip
    assert call.error_type == "ToolError"
    assert call.result_digest == DEFAULT_NORMALIZER.result_digest(
        {"content": "Error: boom", "status": "error"}
    )


def test_name_only_last_resort() -> None:
    call = tool("execute_tool search_docs", {})
    assert (call.tool, call.arguments) == ("search_docs", ABSENT)
    call = tool("search_docs.tool", {"some.attr": 1})
    assert call.tool == "search_docs"
    # A span name that only looks like a tool name is not enough on its own.
    assert map_span(view("search_docs", {})) is None
    # Attributes win over the name: this is a chat span despite its name.
    assert classify({"gen_ai.operation.name": "chat"}, "execute_tool search_docs") is SpanRole.MODEL


def test_unknown_spans_are_skipped_and_counted() -> None:
    stats = MappingStats()
    shapes = [
        view("GET /v1/items", {"http.request.method": "GET"}),
        view(
            "execute_task model",
            {"gen_ai.operation.name": "execute_task", "traceloop.span.kind": "task"},
        ),
        view("turn", {"openinference.span.kind": "CHAIN"}),
        view("embeddings", {"gen_ai.operation.name": "embeddings"}),
        view("running tool", {"gen_ai.operation.name": "execute_tool"}),  # no tool name at all
    ]
    assert [map_span(v, stats=stats) for v in shapes] == [None] * 5
    assert stats.as_dict() == {
        "tool_spans": 0,
        "model_spans": 0,
        "run_spans": 0,
        "other_spans": 4,
        "malformed": 1,
    }


@pytest.mark.parametrize(
    ("name", "attrs", "parent", "agent"),
    [
        (
            "invoke_agent looper",
            {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
            "p",
            "looper",
        ),
        ("invoke_agent looper", {"gen_ai.operation.name": "invoke_agent"}, "p", "looper"),
        ("invoke_workflow triage", {"gen_ai.operation.name": "invoke_workflow"}, "p", "triage"),
        ("looper", {"openinference.span.kind": "AGENT", "agent.name": "looper"}, "p", "looper"),
        ("looper", {"openinference.span.kind": "CHAIN"}, None, "looper"),
        ("looper.workflow", {"traceloop.span.kind": "workflow"}, "p", "looper"),
        ("looper.agent", {"traceloop.span.kind": "agent"}, "p", "looper"),
    ],
)
def test_run_boundaries(name: str, attrs: dict[str, Any], parent: str | None, agent: str) -> None:
    event = map_span(view(name, attrs, parent_span_id=parent))
    assert isinstance(event, RunBoundary)
    assert (event.agent, event.trace_id, event.parent_span_id, event.failed) == (
        agent,
        TRACE,
        parent,
        False,
    )


def test_aggregated_usage_on_run_spans_is_not_a_model_call() -> None:
    stats = MappingStats()
    pydantic_run = view(
        "invoke_agent looper",
        {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper",
         "gen_ai.aggregated_usage.input_tokens": 159, "gen_ai.aggregated_usage.output_tokens": 31},
    )  # fmt: skip
    smol_run = view(
        "looper.run",
        {"openinference.span.kind": "AGENT", "llm.token_count.prompt": 30,
         "llm.token_count.completion": 9},
        parent_span_id=None,
    )  # fmt: skip
    events = [map_span(v, stats=stats) for v in (pydantic_run, smol_run)]
    assert all(isinstance(e, RunBoundary) for e in events)
    assert stats.model_spans == 0


def test_a_nested_chain_is_not_a_run() -> None:
    assert classify({"openinference.span.kind": "CHAIN"}, "tools", "abc") is SpanRole.OTHER


@pytest.mark.parametrize(
    "value",
    [
        "not json {",
        '{"input_str": "x", "inputs": ',  # a truncated envelope
        '{"args": [1, 2], "sanitize_inputs_outputs": true, "kwargs": ',
        12,
        3.5,
        True,
        ("a", "b"),
        b"bytes",
    ],
)
def test_malformed_or_odd_arguments_have_defined_results(value: Any) -> None:
    call = tool(
        "execute_tool t",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "t",
            "gen_ai.tool.call.arguments": value,
        },
    )
    assert call.tool == "t"
    assert sig(call).tool == "t"


def test_huge_argument_string_is_not_parsed() -> None:
    huge = '{"input_str": "x", "inputs": {"q": "' + "a" * (10 * 1024 * 1024) + '"}}'
    call = tool(
        "execute_tool t",
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "t",
            "gen_ai.tool.call.arguments": huge,
        },
    )
    assert call.arguments is huge
    assert sig(call).kind.value == "raw"


def test_wrong_attribute_types_do_not_raise() -> None:
    stats = MappingStats()
    odd = {
        "gen_ai.operation.name": "chat",
        "gen_ai.usage.input_tokens": "12",  # OTLP JSON sends ints as strings
        "gen_ai.usage.output_tokens": -4,
        "gen_ai.response.model": 7,
        "gen_ai.provider.name": ["x"],
    }
    event = map_span(view("chat", odd), stats=stats)
    assert event == ModelCall(input_tokens=12, output_tokens=0, start_s=1.0, end_s=1.5)
    weird_tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": 5,
                  "tool.name": None, "gen_ai.tool.call.id": 3, "gen_ai.tool.call.result": 1.5}  # fmt: skip
    call = map_span(view("execute_tool real", weird_tool), stats=stats)
    assert isinstance(call, ToolCall)
    assert (call.tool, call.call_id, call.result_digest) == (
        "real",
        None,
        DEFAULT_NORMALIZER.result_digest(1.5),
    )
    assert map_span(view("x", {"traceloop.span.kind": ["tool"]}), stats=stats) is None
    assert stats.malformed == 0


_ATTR_KEYS = st.sampled_from(
    [
        "gen_ai.operation.name", "gen_ai.tool.name", "gen_ai.tool.call.arguments",
        "gen_ai.tool.call.id", "gen_ai.tool.call.result", "tool_arguments", "input.value",
        "output.value", "openinference.span.kind", "traceloop.span.kind", "tool.name",
        "gcp.vertex.agent.tool_call_args", "gcp.vertex.agent.tool_response",
        "pydantic_ai.tool.retry.attempt", "pydantic_ai.tool.retry.cause",
        "gen_ai.usage.input_tokens", "llm.token_count.prompt", "error.type",
    ]
)  # fmt: skip
_ATTR_VALUES = st.one_of(
    st.sampled_from(["execute_tool", "chat", "TOOL", "LLM", "AGENT", "CHAIN", "tool", "{}",
                     '{"input_str": 1, "inputs": [1]}', '{"args": 1, "sanitize_inputs_outputs": 1}',
                     '{"tool_call_id": 1, "output": {"lc": 1, "kwargs": 3}}',
                     '{"response_type": "ERROR_HANDLED_BY_REFLECT_AND_RETRY_PLUGIN"}']),
    st.text(max_size=40), st.integers(), st.floats(), st.booleans(),
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    attrs=st.dictionaries(_ATTR_KEYS, _ATTR_VALUES, max_size=8),
    name=st.text(max_size=30),
    status_error=st.booleans(),
    root=st.booleans(),
)
def test_hostile_spans_always_get_an_answer(
    attrs: dict[str, Any], name: str, status_error: bool, root: bool
) -> None:
    stats = MappingStats()
    event = map_span(
        view(name, attrs, status_error=status_error, parent_span_id=None if root else "p"),
        stats=stats,
    )
    assert event is None or isinstance(event, (ToolCall, ModelCall, RunBoundary))
    assert sum(stats.as_dict().values()) == 1
    if isinstance(event, ToolCall):
        signature_of(event.tool, event.arguments)


def test_mapping_is_versioned() -> None:
    assert MAPPING_VERSION == "m3"


def test_tool_span_mapping_needs_no_classification() -> None:
    call = map_tool_span(view("execute_tool t", {"gen_ai.tool.call.arguments": '{"a": 1}'}))
    assert call is not None
    assert (call.tool, call.arguments) == ("t", '{"a": 1}')


@pytest.mark.parametrize(
    ("value", "expected"), [("3", 3), ("٣", 3), ("²", None), ("³", None), ("-1", None), ("1.5", None)]
)
def test_integer_attributes_that_only_look_like_digits_are_ignored(value: str, expected: Any) -> None:
    # "²".isdigit() is True but int("²") raises: such a retry attempt once failed the whole span.
    call = map_tool_span(
        view("running tool", {"gen_ai.tool.name": "t", "pydantic_ai.tool.retry.attempt": value})
    )
    assert call is not None and call.attempt == expected


@pytest.mark.parametrize("value", [{"kind": "execute_tool"}, ["execute_tool"], 3, b"execute_tool"])
def test_an_operation_name_that_is_not_text_classifies_as_other(value: object) -> None:
    # A kvlist or array attribute decodes to a dict or a list: unhashable, it once raised
    # TypeError out of classify (and out of map_span) instead of naming the span "other".
    attributes = {"gen_ai.operation.name": value, "gen_ai.tool.name": "search"}
    assert classify(attributes, "execute_tool search") is SpanRole.OTHER


def test_an_error_type_is_kept_as_printable_text_of_at_most_100_characters() -> None:
    # A span's error.type or exception.type is anyone's text: stored and shown, it must not
    # carry terminal escapes or forged log lines, nor grow without bound.
    hostile = "Timeout\x1b[2J\r\nINFO forged line\x00" + "x" * 500
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "gen_ai.tool.call.result": "r"}
    explicit = tool("execute_tool t", {**base, "error.type": hostile})
    assert explicit.error_type == ("Timeout?[2J??INFO forged line?" + "x" * 500)[:100]
    raised = tool("execute_tool t", base, status_error=True, exception_type=hostile)
    assert raised.error_type == explicit.error_type
    plain = tool("execute_tool t", {**base, "error.type": "httpx.ReadTimeout"})
    assert plain.error_type == "httpx.ReadTimeout"
