"""The kill channel, end to end: an agent in another process stops at its next step after the
service judged its run stuck (Redis pub/sub, or polling the service without Redis)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tripwire.errors import BudgetExceeded, LoopDetected
from tripwire.serve import ServeConfig
from tripwire.serve.killchannel import CHANNEL, KEY_PREFIX
from tripwire.store.runs import RunStore

from .conftest import TOKEN, running_service
from .otlp_helpers import loop_spans, protobuf_body, trace_id_of

AGENT = Path(__file__).with_name("agent_process.py")
REDIS_URL = os.environ.get("TRIPWIRE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def _agent(url: str, channel: str, script: str, steps: int = 12) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    done = subprocess.run(
        [sys.executable, str(AGENT), url, TOKEN, channel, script, str(steps)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def redis_service(redis_client: object, sqlite_store: RunStore) -> Iterator[object]:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, redis_url=REDIS_URL)
    with running_service(config, sqlite_store) as r:
        yield r


def test_agent_process_stops_at_its_next_step_via_redis(redis_service: object) -> None:
    r = redis_service
    result = _agent(r.url, REDIS_URL, "loop")  # type: ignore[attr-defined]
    # The service saw the 4th identical call's span and raised the flag before it answered the
    # export; the agent's next step checked the channel and stopped: no 5th tool body ran. The
    # 5th model call may have started in the milliseconds before the pub/sub message arrived.
    assert result["ended"] == "stopped:loop_detected"
    assert result["bodies"] == 4
    assert result["model_calls"] in (4, 5)
    run = httpx.get(f"{r.url}/api/runs/{result['trace_id']}", headers=r.headers()).json()  # type: ignore[attr-defined]
    assert run["verdict"] == "stuck" and run["killed"] is True
    assert run["flag"]["rule"] == "repetition"


def test_healthy_agent_process_is_left_alone(redis_service: object) -> None:
    result = _agent(redis_service.url, REDIS_URL, "distinct", steps=8)  # type: ignore[attr-defined]
    assert result == {**result, "ended": "finished", "bodies": 8, "model_calls": 8}


def test_agent_process_stops_via_the_store_without_redis(sqlite_store: RunStore) -> None:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, sqlite_store) as r:
        result = _agent(r.url, "http", "loop")
    # Polled every 50 ms: the flag reaches the agent during its 5th model call (600 ms), and the 5th
    # tool body is refused.
    assert result["ended"] == "stopped:loop_detected"
    assert result["bodies"] == 4
    assert result["model_calls"] in (4, 5)


def test_flag_is_a_key_with_ttl_and_a_pubsub_message(redis_service: object, redis_client: object) -> None:
    r = redis_service
    client = redis_client
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[attr-defined]
    pubsub.subscribe(CHANNEL)
    spans = loop_spans(4)
    tid = trace_id_of(spans)
    got = httpx.post(
        f"{r.url}/v1/traces", content=protobuf_body(spans),  # type: ignore[attr-defined]
        headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"},
    )
    assert got.status_code == 200
    # Raised before the answer: the key is there now.
    flag = json.loads(client.get(KEY_PREFIX + tid))  # type: ignore[attr-defined]
    assert flag["kind"] == "loop" and flag["tool"] == "search_docs" and flag["hits"] == 4
    assert 0 < client.ttl(KEY_PREFIX + tid) <= 3600  # type: ignore[attr-defined]
    # The channel is shared: another receiver on this Redis (a second test run) may publish too.
    deadline = time.monotonic() + 5
    ours = None
    while ours is None and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.5)
        if message is not None and json.loads(message["data"]).get("trace_id") == tid:
            ours = message
    assert ours is not None, "no pub/sub message for this trace within 5 s"
    pubsub.close()
    client.delete(KEY_PREFIX + tid)  # type: ignore[attr-defined]


def test_remote_check_raises_the_same_exceptions(redis_client: object) -> None:
    import tripwire.remote as remote
    from tripwire.serve.killchannel import RedisKillChannel, flag_payload

    channel = RedisKillChannel(redis_client)
    watcher = remote.RemoteKill(redis_url=REDIS_URL, poll_s=0.05)
    try:
        tid_loop, tid_budget = "ab" * 16, "cd" * 16
        watcher.check(tid_loop)  # nothing yet: watched from now on
        watcher.check(tid_budget)
        from tripwire.core.budget import Limits, RunCounters, check_before_step

        stop = check_before_step(Limits(max_steps=2), RunCounters(steps=2))
        channel.raise_flag(
            flag_payload(tid_loop, None, at=time.time()) | {"kind": "loop", "reason": "loop_detected", "rule": "period", "tool": "t", "hits": 3, "window": 10, "period": 2, "call_index": 7, "digest": "abcd"},
            60,
        )
        channel.raise_flag(flag_payload(tid_budget, stop, at=time.time()), 60)
        deadline = time.monotonic() + 5
        while (watcher.flagged(tid_loop) is None or watcher.flagged(tid_budget) is None) and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(LoopDetected) as loop:
            watcher.check(tid_loop)
        assert (loop.value.rule.value, loop.value.period, loop.value.call_index) == ("period", 2, 7)
        with pytest.raises(BudgetExceeded) as budget:
            watcher.check(tid_budget)
        assert budget.value.limit_name == "max_steps"
        # Cleared by the service (resolve): the run may go on.
        channel.clear(tid_loop)
        deadline = time.monotonic() + 5
        while watcher.flagged(tid_loop) is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        watcher.check(tid_loop)
        channel.clear(tid_budget)
    finally:
        watcher.close()


def test_remote_fails_closed_when_configured_and_open_by_default() -> None:
    import tripwire.remote as remote

    # Nothing listens on this loopback port: the channel is unreachable.
    closed = remote.RemoteKill(redis_url="redis://127.0.0.1:1/0", poll_s=0.05, on_unavailable="fail_closed", grace_s=0.1)
    opened = remote.RemoteKill(redis_url="redis://127.0.0.1:1/0", poll_s=0.05)
    try:
        time.sleep(0.5)
        with pytest.raises(BudgetExceeded):
            closed.check("ef" * 16)
        opened.check("ef" * 16)  # fail_open: the run goes on
    finally:
        closed.close()
        opened.close()


def test_remote_check_refuses_an_id_the_service_never_writes() -> None:
    import tripwire.remote as remote
    from tripwire.errors import ConfigError

    watcher = remote.RemoteKill(redis_url="redis://127.0.0.1:1/0", poll_s=0.05)
    try:
        # The service keys flags by the 32-hex OpenTelemetry trace id: a run checked under
        # any other spelling would never be stopped, so it is an error, not a silent no-op.
        for wrong in (
            "trace_" + "ab" * 13,  # an OpenAI Agents SDK trace id
            "0af76519-16cd-43dd-8448-eb211c80319c",  # a UUID with dashes
            "ab" * 8,  # a span id
            "g" * 32,
            -1,
            1 << 128,
            10**5000,  # too long for repr(): the message still names it
            b"\xab" * 16,
        ):
            with pytest.raises(ConfigError) as caught:
                watcher.check(wrong)  # type: ignore[arg-type]
            assert caught.value.field == "trace_id"
            assert "32 hex characters" in str(caught.value)
        # Both spellings of one id are the same run.
        watcher.check("AB" * 16)
        watcher.check(int("ab" * 16, 16))
        watcher.check((1 << 128) - 1)
        assert watcher.flagged("Ab" * 16) is None
    finally:
        watcher.close()


def test_operator_kill_and_resolve_through_the_api(redis_service: object, redis_client: object) -> None:
    r = redis_service
    spans = loop_spans(2)
    tid = trace_id_of(spans)
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
    httpx.post(f"{r.url}/v1/traces", content=protobuf_body(spans), headers=headers)  # type: ignore[attr-defined]
    got = httpx.post(f"{r.url}/api/runs/{tid}/kill", headers=r.headers())  # type: ignore[attr-defined]
    assert got.status_code == 200 and got.json()["run"]["killed"] is True
    assert json.loads(redis_client.get(KEY_PREFIX + tid))["by"] == "operator"  # type: ignore[attr-defined]
    got = httpx.post(f"{r.url}/api/runs/{tid}/resolve", headers=r.headers())  # type: ignore[attr-defined]
    assert got.json()["run"]["resolved"] is True
    assert redis_client.get(KEY_PREFIX + tid) is None  # type: ignore[attr-defined]
    assert httpx.post(f"{r.url}/api/runs/{'0' * 31}1/kill", headers=r.headers()).status_code == 404  # type: ignore[attr-defined]


def test_a_run_repeating_itself_in_one_request_is_announced_once(redis_service: object, redis_client: object) -> None:
    # Ten identical calls in one export: stuck at the 4th, and six more repeats after it. Each
    # repeat asks for the flag again (it may have been lowered), but one request raises it and
    # tells every subscribed agent once, with its latest state.
    r = redis_service
    client = redis_client
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[attr-defined]
    pubsub.subscribe(CHANNEL)
    spans = [s for s in loop_spans(10) if s.parent is not None]
    tid = trace_id_of(spans)
    got = httpx.post(
        f"{r.url}/v1/traces", content=protobuf_body(spans),  # type: ignore[attr-defined]
        headers={"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"},
    )
    assert got.status_code == 200
    flag = json.loads(client.get(KEY_PREFIX + tid))  # type: ignore[attr-defined]
    assert flag["kind"] == "loop" and flag["hits"] > 4  # the latest state, not the 4th call's
    ours = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.2)
        if message is not None and json.loads(message["data"]).get("trace_id") == tid:
            ours.append(json.loads(message["data"]))
    pubsub.close()
    client.delete(KEY_PREFIX + tid)  # type: ignore[attr-defined]
    assert [m["hits"] for m in ours] == [flag["hits"]]


def test_without_redis_a_flag_goes_up_with_its_request_and_again_after_an_operator_lowers_it(
    sqlite_store: RunStore,
) -> None:
    # The flag is a row of the store. It goes up in the request whose call made the run stuck
    # (written with that transition). A repeat renews it (its latest state) with the routine
    # writes; once an operator lowered it, the next repeat raises it again in its own request.
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    spans = [s for s in loop_spans(12) if s.parent is not None]
    tid = trace_id_of(spans)
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}
    with running_service(config, sqlite_store) as r:

        def post(part: list) -> None:
            got = httpx.post(f"{r.url}/v1/traces", content=protobuf_body(part), headers=headers, timeout=30)
            assert got.status_code == 200

        def flag() -> dict | None:
            return httpx.get(f"{r.url}/api/flags/{tid}", headers=r.headers(), timeout=30).json()["flag"]

        post(spans[:5])  # stuck at the 4th call
        first = flag()
        assert first is not None and first["kind"] == "loop" and first["hits"] == 5  # its latest state
        assert sqlite_store.run(tid).killed is True  # type: ignore[union-attr]
        post(spans[5:8])  # three repeats: the flag is renewed with their latest state
        deadline = time.monotonic() + 10
        while (flag() or {}).get("hits") != 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        renewed = flag()
        assert renewed is not None and renewed["hits"] == 8 and renewed["at"] >= first["at"]
        got = httpx.post(f"{r.url}/api/runs/{tid}/resolve", headers=r.headers(), timeout=30)
        assert got.status_code == 200 and flag() is None
        post(spans[8:9])  # it repeats once more: up again, before the request is answered
        again = flag()
        assert again is not None and again["hits"] == 9


def _healthy_run(calls: int) -> tuple[list[object], list[object]]:
    """A healthy run's spans from the real SDK, split: its tool spans, then its root span."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span(
        "invoke_agent researcher",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "researcher"},
    ):
        for i in range(calls):
            with tracer.start_as_current_span("execute_tool search_docs", attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search_docs",
                "gen_ai.tool.call.id": f"c{i}", "gen_ai.tool.call.arguments": json.dumps({"query": f"topic {i}"}),
                "gen_ai.tool.call.result": f"notes on topic {i}",
            }):
                pass
    provider.shutdown()
    spans = list(exporter.get_finished_spans())
    return [s for s in spans if s.parent is not None], [s for s in spans if s.parent is None]


def test_an_operator_kill_is_recorded_as_a_cancellation_by_whom_not_as_a_finish(tmp_path: Path) -> None:
    # The agent obeys the flag and then ends its run cleanly (its root span ends without an
    # error): the receipt must still say the run was cancelled, by whom, through what, and the
    # report must count it so, not as `completed`.
    from tripwire.report import build_report

    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    other = "another-token-0123456789abcdef"
    config = ServeConfig(tokens=(other, TOKEN), token_names=("ci-bot", "alice"), reorder_s=0.0, flush_s=0.05)
    pb = {"Content-Type": "application/x-protobuf"}
    try:
        with running_service(config, store) as r:
            tools, root = _healthy_run(6)
            tid = trace_id_of(tools)
            assert httpx.post(f"{r.url}/v1/traces", content=protobuf_body(tools), headers=pb | r.headers()).status_code == 200  # type: ignore[arg-type]
            got = httpx.post(f"{r.url}/api/runs/{tid}/kill", headers=r.headers())
            assert got.status_code == 200
            flag = httpx.get(f"{r.url}/api/flags/{tid}", headers=r.headers()).json()["flag"]
            assert (flag["kind"], flag["reason"], flag["actor"], flag["via"]) == ("operator", "user_cancelled", "alice", "api")
            assert httpx.post(f"{r.url}/v1/traces", content=protobuf_body(root), headers=pb | r.headers()).status_code == 200  # type: ignore[arg-type]
            deadline = time.monotonic() + 10
            run = {}
            while time.monotonic() < deadline:
                run = httpx.get(f"{r.url}/api/runs/{tid}", headers=r.headers()).json()
                if run.get("status") == "ended":
                    break
                time.sleep(0.05)
            assert run["status"] == "ended" and run["stop_reason"] == "user_cancelled"
            receipt = run["receipt"]
            assert (receipt["end"], receipt["reason"]) == ("user_abort", "user_cancelled")
            assert receipt["condition"]["source"] == "operator"
            assert (receipt["condition"]["by"], receipt["condition"]["via"]) == ("alice", "api")
            assert run["health"] == "bounded_stop"
        report = build_report(store)
        assert report.overall.stop_reasons == {"user_cancelled": 1}
    finally:
        store.dispose()


def test_a_run_that_ended_before_the_kill_keeps_its_receipt(tmp_path: Path) -> None:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    pb = {"Content-Type": "application/x-protobuf"}
    try:
        with running_service(config, store) as r:
            tools, root = _healthy_run(3)
            tid = trace_id_of(tools)
            body = protobuf_body([*tools, *root])  # type: ignore[list-item]
            assert httpx.post(f"{r.url}/v1/traces", content=body, headers=pb | r.headers()).status_code == 200
            deadline = time.monotonic() + 10
            while httpx.get(f"{r.url}/api/runs/{tid}", headers=r.headers()).json().get("status") != "ended":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert httpx.post(f"{r.url}/api/runs/{tid}/kill", headers=r.headers()).status_code == 200
            run = httpx.get(f"{r.url}/api/runs/{tid}", headers=r.headers()).json()
            assert run["stop_reason"] == "completed" and run["receipt"]["reason"] == "completed"
            assert run["receipt"]["condition"] == {}
    finally:
        store.dispose()
