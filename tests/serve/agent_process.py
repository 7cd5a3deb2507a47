"""An agent in its own process: a hand-written tool loop that sends OTLP to ``tripwire serve``
and checks the fleet's kill channel before each step (``tripwire.remote``).

Usage: ``python agent_process.py URL TOKEN CHANNEL [loop|distinct] STEPS``; CHANNEL is a Redis
URL or ``http`` (poll the service). Prints one JSON line: the trace id, how many tool bodies
ran, how many model calls were made, and how the run ended.
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import tripwire.remote
from tripwire.errors import RunStopped


def main() -> None:
    url, token, channel, script, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    if channel == "http":
        tripwire.remote.connect(url=url, token=token, poll_s=0.05)
    else:
        tripwire.remote.connect(redis_url=channel, poll_s=0.05)
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(
            OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {token}"})
        )
    )
    tracer = provider.get_tracer("agent")
    bodies = model_calls = 0
    ended = "finished"
    with tracer.start_as_current_span(
        "invoke_agent looper",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
    ) as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        try:
            for step in range(steps):
                tripwire.remote.check(trace_id)  # before the model call of this step
                model_calls += 1
                time.sleep(0.6)  # the model thinks (real model calls take longer)
                tripwire.remote.check(trace_id)  # before the tool runs
                query = "refund policy" if script == "loop" else f"topic {step}"
                with tracer.start_as_current_span(
                    "execute_tool search_docs",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": "search_docs",
                        "gen_ai.tool.call.id": f"call_{step}",
                        "gen_ai.tool.call.arguments": json.dumps({"query": query}),
                        "gen_ai.tool.call.result": "No results." if script == "loop" else f"result {query}",
                    },
                ):
                    bodies += 1
        except RunStopped as exc:
            ended = f"stopped:{exc.reason.value}"
    provider.shutdown()
    print(json.dumps({"trace_id": trace_id, "bodies": bodies, "model_calls": model_calls, "ended": ended}))


if __name__ == "__main__":
    main()
