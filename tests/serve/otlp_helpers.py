"""Build OTLP requests the way real exporters do: the SDK's own encoder, and OTLP/JSON."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


def loop_spans(
    calls: int = 6, *, result: str = "No results.", agent: str = "looper", call_ids: bool = True
) -> tuple[ReadableSpan, ...]:
    """A run span and ``calls`` identical GenAI tool spans, finished, from the real SDK
    (``call_ids=False``: without ``gen_ai.tool.call.id``, as a hand-written loop sends them)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span(
        f"invoke_agent {agent}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent},
    ):
        for i in range(calls):
            with tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    **({"gen_ai.tool.call.id": f"call_{i}"} if call_ids else {}),
                    "gen_ai.tool.call.arguments": json.dumps({"query": "refund policy"}),
                    "gen_ai.tool.call.result": result,
                },
            ):
                pass
    provider.shutdown()
    return tuple(exporter.get_finished_spans())


def protobuf_body(spans: Sequence[ReadableSpan]) -> bytes:
    """The body the stock OTLP/HTTP protobuf exporter sends for ``spans``."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans).SerializePartialToString()


def json_body(spans: Sequence[ReadableSpan]) -> bytes:
    """OTLP/JSON (the protobuf JSON mapping: hex ids, camelCase, int64 as strings)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = MessageToDict(encode_spans(spans))
    # The protobuf JSON mapping writes ids as base64; OTLP/JSON says hex.
    for rs in message.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _b64_to_hex(span[key])
    return json.dumps(message).encode()


def _b64_to_hex(text: str) -> str:
    import base64

    return base64.b64decode(text).hex()


def trace_id_of(spans: Sequence[Any]) -> str:
    return f"{spans[0].context.trace_id:032x}"
