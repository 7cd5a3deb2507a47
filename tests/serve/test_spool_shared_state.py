"""The write-ahead spool with per-trace state in Redis: a request the killed receiver had
already appended to its trace's shared log is not counted twice when the restarted receiver
replays the spool (real ``tripwire serve`` processes, real Redis, a real SQLite store)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tripwire.store.runs import RunStore

from .conftest import free_port
from .otlp_helpers import loop_spans, protobuf_body, trace_id_of
from .service_process import serve_process, stop, wait_ready

REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
TOKEN = "spool-redis-token-0123456789ab"


@pytest.mark.parametrize(
    "second_key",
    [None, "a-new-fleet-digest-key-0123456789"],
    ids=["same-key", "restarted-with-another-digest-key"],
)
def test_a_replayed_request_already_in_the_shared_log_counts_once(
    tmp_path: Path, redis_client: Any, second_key: str | None
) -> None:
    # Three identical calls, no root span: the run goes on, and three calls are not a loop
    # (the fourth would be). Counted twice, they would be six, and the run judged stuck. No
    # call ids (a hand-written loop): the engine's call-id memory cannot tell copies apart.
    # Restarted with another digest key, the replay makes records of other digests from the
    # same spans: they are still known by their span ids.
    spans = [s for s in loop_spans(3, call_ids=False) if s.parent is not None]
    trace_id = trace_id_of(spans)
    db = tmp_path / "runs.db"
    port = free_port()
    args = ["--port", str(port), "--store", f"sqlite:///{db}", "--spool", str(tmp_path / "spool"),
            "--redis", REDIS_URL, "--state", "redis", "--reorder-ms", "0", "--log-format", "text"]
    env = {"TRIPWIRE_TOKEN": TOKEN}
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
    log_key = f"tripwire:log:{trace_id}"
    redis_client.delete(log_key)
    proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
    try:
        wait_ready(port, proc)
        got = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=protobuf_body(spans), headers=headers, timeout=10)
        assert got.status_code == 200, got.text
        # Judged at once (no reorder wait): the records are in the shared log before the 200.
        assert redis_client.llen(log_key) == 3
    finally:
        stop(proc, kill=True)  # within the spool's segment time: the request is still spooled
    try:
        assert proc.returncode == -9
        second_env = env if second_key is None else {**env, "TRIPWIRE_DIGEST_KEY": second_key}
        proc = serve_process(args, env=second_env, stderr=tmp_path / "serve.log")
        try:
            wait_ready(port, proc)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and "replayed 1 spooled" not in (tmp_path / "serve.log").read_text():
                time.sleep(0.05)
            assert "replayed 1 spooled requests" in (tmp_path / "serve.log").read_text()
            assert redis_client.llen(log_key) == 3
        finally:
            stop(proc)
        store = RunStore.open(f"sqlite:///{db}")
        try:
            # The graceful stop wrote the run as the restarted receiver judged it.
            rows, total = store.runs()
            assert total == 1, (tmp_path / "serve.log").read_text()
            assert rows[0].tool_calls == 3 and rows[0].verdict != "stuck", rows[0]
        finally:
            store.dispose()
    finally:
        redis_client.delete(log_key)


@pytest.mark.redis
def test_a_late_span_is_left_out_by_every_receiver_sharing_the_log(redis_client: Any) -> None:
    # Receiver A judged the run and its root; the late span goes to receiver B, which has never
    # seen the trace: B replays the log (the root ends the run there too) and leaves it out.
    from tripwire.serve.shared_state import LOG_PREFIX, RedisFleet
    from tripwire.spans import SpanView

    tid = os.urandom(16).hex()
    redis_client.delete(LOG_PREFIX + tid)

    def tool(i: int) -> SpanView:
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                 "gen_ai.tool.call.id": f"c{i}", "gen_ai.tool.call.arguments": f'{{"q": {i}}}'}
        return SpanView(trace_id=tid, span_id=f"{i + 1:016x}", parent_span_id="f" * 16, name="execute_tool search",
                        start_s=100.0 + i, end_s=100.5 + i, attributes=attrs)

    root = SpanView(trace_id=tid, span_id="f" * 16, name="invoke_agent a", start_s=99.0, end_s=200.0,
                    attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})
    try:
        a, b = RedisFleet(redis_client, reorder_s=0), RedisFleet(redis_client, reorder_s=0)
        out = a.process([tool(0), tool(1), root], now=1.0)
        assert [(r.agent, r.tool_calls) for r in out.ended_runs] == [("a", 2)]
        late = b.process([tool(2)], now=2.0)
        assert late.late_spans == 1 and late.urgent.runs == [] and late.routine.runs == []
        assert a.process([tool(3)], now=3.0).late_spans == 1
        assert b.process([], now=400.0).ended_runs == []
    finally:
        redis_client.delete(LOG_PREFIX + tid)


@pytest.mark.redis
def test_the_redis_fleet_forgets_ended_runs_past_their_window_too(redis_client: Any) -> None:
    from tripwire.serve.shared_state import LOG_PREFIX, RedisFleet
    from tripwire.spans import SpanView

    tids = [os.urandom(16).hex() for _ in range(3)]
    try:
        fleet = RedisFleet(redis_client, reorder_s=0, idle_ttl_s=60)
        for t, tid in enumerate(tids):
            root = SpanView(trace_id=tid, span_id="f" * 16, name="invoke_agent a", start_s=1.0, end_s=2.0,
                            attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"})
            fleet.process([root], now=1.0 + t)
        assert len(fleet._ended) == 3
        fleet.process([], now=4.0 + 61)
        assert len(fleet._ended) == 0
    finally:
        redis_client.delete(*[LOG_PREFIX + tid for tid in tids])
