"""Backend outages lose nothing: the real PostgreSQL made unreachable (a TCP proxy cut), a
private redis-server stopped and started again."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tripwire.serve import ServeConfig
from tripwire.serve.alerts import AlertTarget
from tripwire.store.runs import RunStore

from .conftest import TOKEN, free_port, running_service
from .otlp_helpers import loop_spans, protobuf_body
from .tcp_proxy import TcpProxy

PG = "postgresql+psycopg://postgres@127.0.0.1:{port}/test"
PB = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
HOOK = (AlertTarget(kind="webhook", url="http://127.0.0.1:9/nobody"),)


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what}; CI=true requires it", pytrace=False)
    pytest.skip(f"SKIPPED, NEEDS A SERVICE: {what}")


@pytest.fixture
def pg_proxy() -> Iterator[TcpProxy]:
    try:
        RunStore.open(PG.format(port=5432)).dispose()
    except Exception as exc:
        _missing(f"PostgreSQL at 127.0.0.1:5432 is unreachable ({type(exc).__name__})")
    proxy = TcpProxy(5432, free_port())
    yield proxy
    proxy.close()


def _trace_id(spans: Any) -> str:
    return format(spans[0].context.trace_id, "032x")


def test_a_postgres_outage_is_503_then_nothing_lost(pg_proxy: TcpProxy) -> None:
    store = RunStore.open(PG.format(port=pg_proxy.port))
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, alerts=HOOK)
    spans = loop_spans(6)
    trace_id = _trace_id(spans)
    try:
        with running_service(config, store) as r:
            pg_proxy.cut()
            # Judged, but the store refuses the transition: 503, the exporter will retry.
            got = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(spans), headers=PB, timeout=30)
            assert got.status_code == 503 and "Retry-After" in got.headers
            # While the writes are owed, new requests wait too (not judged into a void).
            again = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(1)), headers=PB, timeout=30)
            assert again.status_code == 503
            pg_proxy.restore()
            deadline = time.monotonic() + 20
            while r.service.unwritten and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not r.service.unwritten
            # The exporter's retry of the first request is accepted (its spans counted once).
            retry = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(spans), headers=PB, timeout=30)
            assert retry.status_code == 200
    finally:
        check = RunStore.open(PG.format(port=5432))
        row = check.run(trace_id)
        history = check.verdicts(trace_id)
        alerts = [o for o in check.outbox() if o["trace_id"] == trace_id]
        flag = check.flag(trace_id, time.time())
        check.dispose()
        store.dispose()
    assert row is not None and row.verdict == "stuck" and row.status == "ended"
    # Its kill flag went up with the transition once the store answered again (no Redis: the
    # flag is a row of the store, written in the transaction of the transition).
    assert row.killed is True and flag is not None and flag["reason"] == "loop_detected"
    assert row.tool_calls == 6
    assert [v.verdict for v in history].count("stuck") == 1
    assert [a["action"] for a in alerts].count("trigger") == 1


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[tuple[int, Any]]:
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("the redis-server binary is not installed")
    import redis

    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        procs.append(subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path),
                                       "--save", "60 1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for _ in range(200):
            try:
                if redis.Redis(port=port).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise AssertionError("the private redis-server did not start")

    def stop() -> None:
        with contextlib.suppress(redis.ConnectionError):
            redis.Redis(port=port).shutdown(save=True)
        procs[-1].wait(timeout=20)

    start()
    yield port, (start, stop)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)


def test_kill_flags_refused_by_a_restarting_redis_are_raised_when_it_is_back(
    sqlite_store: RunStore, private_redis: tuple[int, Any]
) -> None:
    import redis

    port, (start, stop) = private_redis
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, redis_url=f"redis://127.0.0.1:{port}/0")
    spans = loop_spans(6)
    trace_id = _trace_id(spans)
    with running_service(config, sqlite_store) as r:
        stop()
        got = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(spans), headers=PB, timeout=30)
        assert got.status_code == 200  # the transition is in the store; the flag is owed
        assert r.service.pending_kills
        start()
        deadline = time.monotonic() + 20
        while r.service.pending_kills and time.monotonic() < deadline:
            time.sleep(0.05)
        assert redis.Redis(port=port).exists(f"tripwire:kill:{trace_id}")
    row = sqlite_store.run(trace_id)
    assert row is not None and row.verdict == "stuck"
