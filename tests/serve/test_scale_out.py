"""Scale-out on Redis: three receiver processes on three ports, the spans of every trace
scattered round-robin across them, state in Redis and the run store in the shared PostgreSQL:
the verdicts equal those of one receiver judging the same spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tripwire.serve.fleet import Fleet
from tripwire.serve.otlp import decode_request
from tripwire.store.runs import RunStore

from .conftest import free_port
from .otlp_helpers import protobuf_body
from .service_process import wait_ready

REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_URL = os.environ.get("TRIPWIRE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TOKEN = "scale-out-token-0123456789"


def _fleet_spans() -> list[Any]:
    """Twelve runs of four kinds, their spans interleaved in start order (as a fleet sends)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("fleet")
    kinds = ["loop", "distinct", "cycle", "browse"] * 3
    words = ("billing", "shipping", "returns", "warranty", "invoices", "accounts", "refunds", "orders", "taxes")
    roots = []
    for n, kind in enumerate(kinds):
        roots.append(tracer.start_span(f"invoke_agent {kind}", attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": f"{kind}-{n}"}))
    from opentelemetry import trace

    for step in range(9):
        for n, kind in enumerate(kinds):
            if kind == "loop":
                tool, args, result = "search_docs", {"query": "refund policy"}, "No results."
            elif kind == "distinct":
                tool, args, result = "search_docs", {"query": words[step]}, f"the {words[step]} page"
            elif kind == "cycle":
                tool = ("open", "read")[step % 2]
                args, result = {"path": "a.txt"}, "same"
            else:
                tool = ("open_page", "read_page")[step % 2]
                args, result = {"page": words[step]}, f"text of {words[step]}"
            ctx = trace.set_span_in_context(roots[n])
            with tracer.start_as_current_span(f"execute_tool {tool}", context=ctx, attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": f"c{n}-{step}", "gen_ai.tool.call.arguments": json.dumps(args),
                "gen_ai.tool.call.result": result,
            }):
                pass
    for root in roots:
        root.end()
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _receiver(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "serve", "--port", str(port),
         "--store", PG_URL, "--redis", REDIS_URL, "--state", "redis", "--reorder-ms", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


@pytest.fixture
def pg_store(redis_client: Any) -> Iterator[RunStore]:
    try:
        store = RunStore.open(PG_URL)
    except Exception as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is unreachable ({exc}); CI=true requires it", pytrace=False)
        pytest.skip(f"SKIPPED, NEEDS A SERVICE: PostgreSQL at {PG_URL} ({exc})")
    store.truncate()
    yield store
    store.truncate()
    store.dispose()


def test_three_receivers_on_redis_agree_with_one(pg_store: RunStore, redis_client: Any) -> None:
    spans = _fleet_spans()
    spans.sort(key=lambda s: (s.end_time if s.parent is None else s.start_time))
    for key in redis_client.scan_iter(match="tripwire:log:*"):
        redis_client.delete(key)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), TRIPWIRE_TOKEN=TOKEN)
    ports = [free_port() for _ in range(3)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(_receiver(ports[0], env))
        wait_ready(ports[0], procs[0])  # the first one migrates the shared store
        procs += [_receiver(p, env) for p in ports[1:]]
        for port, proc in zip(ports[1:], procs[1:], strict=True):
            wait_ready(port, proc)
        headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(timeout=10) as client:
            for i, span in enumerate(spans):
                got = client.post(f"http://127.0.0.1:{ports[i % 3]}/v1/traces", content=protobuf_body([span]), headers=headers)
                assert got.status_code == 200, got.text
        rows, total = pg_store.runs(limit=100)
        deadline = time.monotonic() + 10
        while (total < 12 or any(r.status != "ended" for r in rows)) and time.monotonic() < deadline:
            time.sleep(0.1)
            rows, total = pg_store.runs(limit=100)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=20)
    # One receiver, in memory, the same spans in the same order.
    reference = Fleet(reorder_s=0)
    expected = {}
    for span in spans:
        out = reference.process(decode_request(protobuf_body([span]), "application/x-protobuf").views, now=time.time())
        for row in out.ended_runs:
            expected[row.trace_id] = (row.agent, row.verdict, row.rule, row.first_stuck_call, row.tool_calls, row.stop_reason)
    got = {r.trace_id: (r.agent, r.verdict, r.rule, r.first_stuck_call, r.tool_calls, r.stop_reason) for r in rows}
    assert len(expected) == 12
    assert got == expected
    # And the scenario is not trivial: loops and cycles stuck, the others working.
    verdicts = sorted((v[0].split("-")[0], v[1]) for v in expected.values())
    assert verdicts.count(("loop", "stuck")) == 3 and verdicts.count(("cycle", "stuck")) == 3
    assert verdicts.count(("distinct", "working")) == 3 and verdicts.count(("browse", "working")) == 3
    # Each stuck run was flagged once, by whichever receiver saw its deciding call.
    flagged = [r for r in rows if r.killed]
    assert len(flagged) == 6
