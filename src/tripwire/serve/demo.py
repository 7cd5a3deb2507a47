"""``tripwire demo --serve``: the fleet service on the embedded SQLite store, with a simulated
fleet of agents sending it real OTLP (some looping, some healthy, some running out of budget).

Each simulated agent is a plain tool loop with its own OpenTelemetry ``TracerProvider`` and the
stock OTLP/HTTP exporter pointed at the service; before each step it asks the kill channel
(:mod:`tripwire.remote`, polling the service), so a looping agent really stops once the service
judged it stuck. New runs start every few seconds until the demo is stopped.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Final

__all__ = ["AGENTS", "run_fleet"]

WORDS: Final = (
    "billing", "shipping", "returns", "warranty", "invoices", "accounts", "refunds", "orders",
    "taxes", "pricing", "status", "privacy", "terms", "contact", "careers", "support", "limits",
)


@dataclass(frozen=True, slots=True)
class Agent:
    name: str
    kind: str
    """``loop`` (the same search again and again), ``cycle`` (search, read, search, read…),
    ``healthy`` (different useful calls, then an answer), ``budget`` (more calls than the
    service's ``max_tool_calls``)."""
    calls: int


AGENTS: Final = (
    Agent("support-bot", "loop", 40),
    Agent("research-agent", "healthy", 24),
    Agent("billing-agent", "healthy", 12),
    Agent("docs-crawler", "cycle", 40),
    Agent("batch-exporter", "budget", 80),
    Agent("triage-agent", "healthy", 18),
)


def _step(agent: Agent, i: int, rng: random.Random) -> tuple[str, dict[str, object], str]:
    if agent.kind == "loop":
        return "search_docs", {"query": "refund policy"}, "No results found."
    if agent.kind == "cycle":
        tool = ("open_page", "read_page")[i % 2]
        return tool, {"page": "faq"}, "the same FAQ text"
    word = WORDS[i % len(WORDS)] + " " + rng.choice(WORDS)
    if agent.kind == "budget":
        return "export_row", {"row": word}, f"exported {word}"
    return ("search_docs", "fetch_page")[i % 2], {"query": word}, f"notes about {word}"


def _run_agent(url: str, token: str, agent: Agent, stop: threading.Event, step_s: float, seed: int) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    import tripwire.remote
    from tripwire.errors import RunStopped

    rng = random.Random(seed)
    provider = TracerProvider(resource=Resource.create({"service.name": agent.name}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=f"{url}/v1/traces", headers={"Authorization": f"Bearer {token}"}),
            schedule_delay_millis=200,
        )
    )
    tracer = provider.get_tracer("tripwire-demo")
    remote = tripwire.remote.connect(url=url, token=token, poll_s=0.25)
    with tracer.start_as_current_span(
        f"invoke_agent {agent.name}",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent.name},
    ) as root:
        trace_id = f"{root.get_span_context().trace_id:032x}"
        try:
            for i in range(agent.calls):
                if stop.is_set():
                    break
                remote.check(trace_id)
                with tracer.start_as_current_span(
                    "chat gpt-4o-mini",
                    attributes={
                        "gen_ai.operation.name": "chat",
                        "gen_ai.request.model": "gpt-4o-mini",
                        "gen_ai.usage.input_tokens": 400 + 40 * i,
                        "gen_ai.usage.output_tokens": 60,
                    },
                ):
                    time.sleep(step_s * rng.uniform(0.5, 1.5))
                tool, args, result = _step(agent, i, rng)
                with tracer.start_as_current_span(
                    f"execute_tool {tool}",
                    attributes={
                        "gen_ai.operation.name": "execute_tool",
                        "gen_ai.tool.name": tool,
                        "gen_ai.tool.call.id": f"call_{i}",
                        "gen_ai.tool.call.arguments": json.dumps(args),
                        "gen_ai.tool.call.result": result,
                    },
                ):
                    time.sleep(0.02)
        except RunStopped:
            pass  # the fleet service stopped this run: the agent ends it here
    provider.shutdown()


def run_fleet(url: str, token: str, stop: threading.Event, *, step_s: float = 0.3, waves: int | None = None) -> None:
    """Start waves of the simulated agents (one thread each) until ``stop`` is set."""
    wave = 0
    while not stop.is_set() and (waves is None or wave < waves):
        threads = [
            threading.Thread(target=_run_agent, args=(url, token, agent, stop, step_s, wave * 100 + n), daemon=True)
            for n, agent in enumerate(AGENTS)
        ]
        for t in threads:
            t.start()
            stop.wait(0.3)
        for t in threads:
            while t.is_alive() and not stop.is_set():
                t.join(timeout=0.5)
        wave += 1
        stop.wait(2.0)
