"""A fleet for the integration tests: ``tripwire serve`` in another process, and an agent in this
one that sends its spans there (the stock OTLP/HTTP exporter) and obeys the service's flags.

:class:`Probe` is what the agent's fake model and tool bodies report to: every model call and
every tool body is an event in order, each tool body also sends an ``execute_tool`` span of the
run's trace, and each model call takes ``model_s`` seconds (a model thinks). A test reads from
the events what ran after the flagged call or after the operator's Kill.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from serve.conftest import free_port
from serve.service_process import serve_process, stop, wait_ready

from .scripts import Counters, fetch_page_body, lookup_order_body, search_docs_body

TOKEN = "fleet-token-0123456789abcdef"
BODIES = {"search_docs": search_docs_body, "fetch_page": fetch_page_body, "lookup_order": lookup_order_body}


@dataclass
class Fleet:
    """A running ``tripwire serve`` (its own process, SQLite store, bearer token)."""

    url: str
    proc: Any

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def run_known(self, trace_id: str) -> bool:
        got = httpx.get(f"{self.url}/api/runs/{trace_id}", headers=self.headers, timeout=5)
        return got.status_code == 200

    def flag(self, trace_id: str) -> dict[str, Any] | None:
        got = httpx.get(f"{self.url}/api/flags/{trace_id}", headers=self.headers, timeout=5)
        got.raise_for_status()
        body = got.json()
        flag = body.get("flag", body) if isinstance(body, dict) else None
        return flag if isinstance(flag, dict) and flag.get("trace_id") else None

    def kill(self, trace_id: str) -> None:
        got = httpx.post(f"{self.url}/api/runs/{trace_id}/kill", headers=self.headers, timeout=5)
        assert got.status_code == 200, got.text


@contextmanager
def fleet(tmp: Path, redis_url: str | None = None) -> Iterator[Fleet]:
    """``tripwire serve`` on a free port; with ``redis_url``, its kill channel is Redis."""
    port = free_port()
    args = ["--port", str(port), "--store", f"sqlite:///{tmp / 'runs.db'}", "--spool", "off",
            "--reorder-ms", "0", "--log-format", "text"]  # fmt: skip
    if redis_url is not None:
        args += ["--redis", redis_url]
    proc = serve_process(args, env={"TRIPWIRE_TOKEN": TOKEN}, stderr=tmp / "serve.log")
    try:
        wait_ready(port, proc)
        yield Fleet(url=f"http://127.0.0.1:{port}", proc=proc)
    finally:
        stop(proc)


@dataclass
class Probe:
    """The agent's side: its tracer (exporting to the fleet), the run's span, and the events."""

    fleet: Fleet
    model_s: float = 0.2
    events: list[tuple[str, float]] = field(default_factory=list)
    provider: TracerProvider | None = None
    parent: otel_context.Context | None = None
    trace_id: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.provider = TracerProvider()
        exporter = OTLPSpanExporter(endpoint=f"{self.fleet.url}/v1/traces", headers=self.fleet.headers)
        self.provider.add_span_processor(SimpleSpanProcessor(exporter))

    @contextmanager
    def run(self, agent: str = "looper") -> Iterator[str]:
        """The run's span, current for the block (what a framework's instrumentation makes)."""
        assert self.provider is not None
        tracer = self.provider.get_tracer("fleet-test")
        attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent}
        with tracer.start_as_current_span(f"invoke_agent {agent}", attributes=attributes) as root:
            self.parent = trace.set_span_in_context(root)
            self.trace_id = f"{root.get_span_context().trace_id:032x}"
            yield self.trace_id

    def model(self) -> None:
        with self._lock:
            self.events.append(("model", time.monotonic()))
        time.sleep(self.model_s)

    def tool(self, name: str, args: dict[str, Any]) -> None:
        assert self.provider is not None
        with self._lock:
            self.events.append(("tool", time.monotonic()))
            n = sum(1 for kind, _ in self.events if kind == "tool")
        span = self.provider.get_tracer("fleet-test").start_span(
            f"execute_tool {name}",
            context=self.parent,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.call.id": f"call_{n}",
                "gen_ai.tool.call.arguments": json.dumps(args),
                "gen_ai.tool.call.result": BODIES[name](**args),
            },
        )
        span.end()  # exported now (SimpleSpanProcessor), before the body returns

    def after(self, kind: str, *, tool_index: int | None = None, at: float | None = None) -> int:
        """Events of ``kind`` after the ``tool_index``-th tool body (1-based) or after ``at``."""
        events = list(self.events)
        if tool_index is not None:
            seen = 0
            for i, (k, _) in enumerate(events):
                seen += k == "tool"
                if k == "tool" and seen == tool_index:
                    return sum(1 for kk, _ in events[i + 1 :] if kk == kind)
            raise AssertionError(f"only {seen} tool bodies ran, not {tool_index}")
        assert at is not None
        return sum(1 for k, t in events if k == kind and t > at)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.events if k == kind)

    def close(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


PROBE: Probe | None = None
"""The probe of the running test (the frameworks' harnesses build their own Counters)."""


class ProbedCounters(Counters):
    """The project's Counters, also reporting every model call and tool body to :data:`PROBE`."""

    def tool(self, name: str, args: dict[str, Any]) -> None:
        super().tool(name, args)
        if PROBE is not None:
            PROBE.tool(name, args)

    def model(self) -> int:
        n = super().model()
        if PROBE is not None:
            PROBE.model()
        return n


class Killer(threading.Thread):
    """Kills the run through the API once ``after_bodies`` tool bodies ran (and the service
    knows the run); notes the time of the accepted Kill."""

    def __init__(self, probe: Probe, after_bodies: int = 3) -> None:
        super().__init__(daemon=True)
        self.probe = probe
        self.after_bodies = after_bodies
        self.killed_at: float | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                tid = self.probe.trace_id
                if tid and self.probe.count("tool") >= self.after_bodies and self.probe.fleet.run_known(tid):
                    self.probe.fleet.kill(tid)
                    self.killed_at = time.monotonic()
                    return
                time.sleep(0.02)
            raise AssertionError("the run never reached the service")
        except BaseException as exc:  # handed to the test thread
            self.error = exc


def env_for(fleet: Fleet) -> dict[str, str]:
    """The environment that names the fleet's kill channel (no connect() in the agent)."""
    return {"TRIPWIRE_URL": fleet.url, "TRIPWIRE_TOKEN": TOKEN}


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


