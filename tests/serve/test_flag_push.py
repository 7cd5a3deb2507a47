"""The push side of the URL kill channel: ``POST /api/flags/wait`` (a long poll), through a plain
HTTP client against a real service, and ``tripwire.remote`` waiting on it instead of polling."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import tripwire.remote as remote
from tripwire.errors import LoopDetected
from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore

from .conftest import TOKEN, Running, running_service
from .otlp_helpers import loop_spans, protobuf_body, trace_id_of

REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _export(url: str, spans: Any) -> None:
    got = httpx.post(
        f"{url}/v1/traces", content=protobuf_body(spans),
        headers={"Content-Type": "application/x-protobuf", **AUTH},
    )
    assert got.status_code == 200, got.text


def _wait_in_thread(url: str, body: dict[str, Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            got = httpx.post(f"{url}/api/flags/wait", json=body, headers=AUTH, timeout=90)
            out["status"], out["body"] = got.status_code, got.json()
        except httpx.HTTPError as exc:
            out["error"] = repr(exc)
        out["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _until_waiting(r: Running, n: int = 1) -> None:
    deadline = time.monotonic() + 10
    while len(r.service.flag_watch) < n:
        assert time.monotonic() < deadline, "the wait request never reached the service"
        time.sleep(0.01)


@pytest.fixture
def no_redis(sqlite_store: RunStore) -> Iterator[Running]:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, sqlite_store) as r:
        yield r


def test_wait_needs_the_token_and_a_well_formed_body(no_redis: Running) -> None:
    url = f"{no_redis.url}/api/flags/wait"
    assert httpx.post(url, json={"trace_ids": ["ab" * 16]}).status_code == 401
    assert httpx.post(url, json={"trace_ids": ["ab" * 16]}, headers={"Authorization": "Bearer nope"}).status_code == 401
    for bad in (
        {},
        {"trace_ids": "ab" * 16},
        {"trace_ids": ["ab" * 16] * 1001},
        {"trace_ids": ["ab" * 16], "timeout_s": 61},
        {"trace_ids": ["ab" * 16], "timeout_s": -1},
        {"trace_ids": ["ab" * 16], "timeout_s": True},
        {"trace_ids": ["ab" * 16], "flagged": "ab" * 16},
        [],
    ):
        got = httpx.post(url, json=bad, headers=AUTH)
        assert got.status_code == 400, bad
        assert "trace_ids" in got.json()["error"]


def test_wait_answers_empty_after_its_timeout(no_redis: Running) -> None:
    thread, out = _wait_in_thread(no_redis.url, {"trace_ids": ["ab" * 16], "timeout_s": 0.4})
    thread.join(30)
    assert out["status"] == 200
    assert out["body"] == {"flags": {}, "changed": False}
    assert out["took"] >= 0.4


def test_wait_answers_when_the_receiver_raises_the_flag(no_redis: Running) -> None:
    spans = loop_spans(4)
    tid = trace_id_of(spans)
    thread, out = _wait_in_thread(no_redis.url, {"trace_ids": [tid.upper()], "timeout_s": 60})
    _until_waiting(no_redis)
    assert "status" not in out  # nothing flagged yet: it waits
    _export(no_redis.url, spans)  # the 4th identical call: the receiver raises the flag
    thread.join(30)
    assert not thread.is_alive(), "the waiter was not woken by the flag"
    assert out["status"] == 200 and out["body"]["changed"] is True
    flag = out["body"]["flags"][tid]
    assert (flag["kind"], flag["rule"], flag["hits"], flag["tool"]) == ("loop", "repetition", 4, "search_docs")
    assert out["took"] < 30  # woken, long before its 60 s


def test_wait_answers_at_once_when_the_agent_is_behind_and_on_resolve(no_redis: Running) -> None:
    r = no_redis
    spans = loop_spans(4)
    tid = trace_id_of(spans)
    _export(r.url, spans)
    # The agent holds no flag but one is up: answered at once, whatever the timeout.
    thread, out = _wait_in_thread(r.url, {"trace_ids": [tid], "flagged": [], "timeout_s": 60})
    thread.join(30)
    assert out["body"]["changed"] is True and tid in out["body"]["flags"]
    # The agent holds it: the request waits until an operator lowers it.
    thread, out = _wait_in_thread(r.url, {"trace_ids": [tid], "flagged": [tid], "timeout_s": 60})
    _until_waiting(r)
    assert "status" not in out
    assert httpx.post(f"{r.url}/api/runs/{tid}/resolve", headers=AUTH).status_code == 200
    thread.join(30)
    assert not thread.is_alive()
    assert out["body"] == {"flags": {}, "changed": True}
    # ... and an operator's Kill raises it again, waking the next wait.
    thread, out = _wait_in_thread(r.url, {"trace_ids": [tid], "timeout_s": 60})
    _until_waiting(r)
    assert httpx.post(f"{r.url}/api/runs/{tid}/kill", headers=AUTH).status_code == 200
    thread.join(30)
    assert out["body"]["flags"][tid]["kind"] == "operator"


def test_waiters_are_bounded(no_redis: Running) -> None:
    no_redis.service.flag_watch.max_waiters = 1
    thread, out = _wait_in_thread(no_redis.url, {"trace_ids": ["ab" * 16], "timeout_s": 3})
    _until_waiting(no_redis)
    got = httpx.post(f"{no_redis.url}/api/flags/wait", json={"trace_ids": ["cd" * 16]}, headers=AUTH)
    assert got.status_code == 503 and got.headers["Retry-After"] == "1"
    thread.join(30)
    assert out["body"] == {"flags": {}, "changed": False}


def test_a_waiting_request_does_not_hold_the_shutdown(sqlite_store: RunStore) -> None:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, sqlite_store) as r:
        thread, out = _wait_in_thread(r.url, {"trace_ids": ["ab" * 16], "timeout_s": 60})
        _until_waiting(r)
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    thread.join(30)
    # Answered (not cut off when uvicorn's 5 s graceful timeout cancels the request).
    assert out.get("status") == 200, out
    assert out["body"] == {"flags": {}, "changed": False}
    assert took < 5


def test_a_flag_raised_by_another_receiver_wakes_the_wait_through_redis(
    redis_client: Any, tmp_path: Any
) -> None:
    # Two receivers on one Redis (kill channel) and one store: the agent waits on the first,
    # its spans go to the second.
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, redis_url=REDIS_URL)
    spans = loop_spans(4)
    tid = trace_id_of(spans)
    try:
        with running_service(config, store) as first, running_service(config, store) as second:
            thread, out = _wait_in_thread(first.url, {"trace_ids": [tid], "timeout_s": 60})
            _until_waiting(first)
            time.sleep(0.3)  # the first receiver's pub/sub listener subscribes
            _export(second.url, spans)
            thread.join(30)
            assert not thread.is_alive(), "the other receiver's flag never woke the wait"
            assert out["body"]["changed"] is True and out["body"]["flags"][tid]["hits"] == 4
    finally:
        redis_client.delete(f"tripwire:kill:{tid}")
        store.dispose()


def test_remote_waits_for_its_flag_instead_of_polling(no_redis: Running) -> None:
    from tripwire.otel.killswitch import KILL_FLAGS

    r = no_redis
    spans = loop_spans(4)
    tid = trace_id_of(spans)
    # poll_s=60: were the agent polling, it would not see the flag within the test.
    watcher = remote.RemoteKill(url=r.url, token=TOKEN, poll_s=60)
    try:
        watcher.check(tid)  # watched from now on
        _until_waiting(r)
        _export(r.url, spans)
        deadline = time.monotonic() + 20
        while watcher.flagged(tid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(LoopDetected):
            watcher.check(tid)
        assert KILL_FLAGS.get(tid) is not None  # tripwire.check() stops the run too
        # A run first checked after the wait began is asked about at once, not in 60 s.
        other = loop_spans(4)
        other_tid = trace_id_of(other)
        _export(r.url, other)
        watcher.check(other_tid)
        deadline = time.monotonic() + 20
        while watcher.flagged(other_tid) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.flagged(other_tid) is not None
        # Resolved by an operator: the run may go on, in both registries.
        assert httpx.post(f"{r.url}/api/runs/{tid}/resolve", headers=AUTH).status_code == 200
        deadline = time.monotonic() + 20
        while watcher.flagged(tid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        watcher.check(tid)
        assert KILL_FLAGS.get(tid) is None
    finally:
        watcher.close()
        KILL_FLAGS.clear(tid)


def test_remote_polls_a_service_without_the_wait_endpoint(sqlite_store: RunStore) -> None:
    from starlette.routing import Route

    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, sqlite_store) as r:
        # An older service: the same app without POST /api/flags/wait.
        app = r.server.config.app
        app.router.routes[:] = [
            route for route in app.router.routes
            if not (isinstance(route, Route) and route.path == "/api/flags/wait")
        ]
        assert httpx.post(f"{r.url}/api/flags/wait", json={"trace_ids": []}, headers=AUTH).status_code in (404, 405)
        spans = loop_spans(4)
        tid = trace_id_of(spans)
        watcher = remote.RemoteKill(url=r.url, token=TOKEN, poll_s=0.05)
        try:
            watcher.check(tid)
            _export(r.url, spans)
            deadline = time.monotonic() + 20
            while watcher.flagged(tid) is None and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(LoopDetected):
                watcher.check(tid)
        finally:
            watcher.close()
            from tripwire.otel.killswitch import KILL_FLAGS

            KILL_FLAGS.clear(tid)


def _doc_block(marker: str) -> str:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "serve.md").read_text(encoding="utf-8")
    after = text[text.index(marker):]
    start = after.index("```python\n") + len("```python\n")
    return after[start: after.index("```", start)]


def test_the_documented_fast_setup_runs_as_written_against_a_service(no_redis: Running) -> None:
    import subprocess
    import sys

    setup = _doc_block("docs-test: skip needs a running tripwire serve")
    assert "instrument(endpoint=url, token=token)" in setup
    loop = '''
import json, tripwire
from opentelemetry import trace
from tripwire.errors import RunStopped
tracer = trace.get_tracer("doc-agent")
bodies = 0
with tracer.start_as_current_span("invoke_agent looper", attributes={"gen_ai.operation.name": "invoke_agent"}):
    try:
        for step in range(30):
            tripwire.check()
            with tracer.start_as_current_span("execute_tool search_docs", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.arguments": json.dumps({"q": "refund policy"}),
                "gen_ai.tool.call.result": "No results."}):
                bodies += 1
    except RunStopped as exc:
        print(json.dumps({"bodies": bodies, "reason": exc.reason.value}))
trace.get_tracer_provider().shutdown()
'''
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPWIRE_") or k == "TRIPWIRE_NO_EXTENSIONS"}
    env.update(TRIPWIRE_URL=no_redis.url, TRIPWIRE_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", setup + loop], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"bodies": 4, "reason": "loop_detected"}
    # The spans reached the service without a flush before the stop: it has the run, stuck.
    deadline = time.monotonic() + 20
    runs: list[Any] = []
    while not runs and time.monotonic() < deadline:
        runs = httpx.get(f"{no_redis.url}/api/runs", params={"verdict": "stuck"}, headers=AUTH).json()["runs"]
        time.sleep(0.05)
    assert runs and runs[0]["tool_calls"] == 4


def test_poll_and_wait_answer_the_same_flags(no_redis: Running) -> None:
    # The two endpoints an agent in any language uses: the poll and the long poll agree.
    spans = loop_spans(4)
    tid, other = trace_id_of(spans), "ef" * 16
    _export(no_redis.url, spans)
    polled = httpx.post(f"{no_redis.url}/api/flags", json={"trace_ids": [tid, other]}, headers=AUTH)
    waited = httpx.post(
        f"{no_redis.url}/api/flags/wait", json={"trace_ids": [tid, other], "flagged": [], "timeout_s": 5}, headers=AUTH,
    )
    assert polled.status_code == waited.status_code == 200
    assert set(polled.json()["flags"]) == {tid}
    assert waited.json() == {"flags": polled.json()["flags"], "changed": True}
    assert httpx.post(f"{no_redis.url}/api/flags", json={"trace_ids": [tid]}).status_code == 401
