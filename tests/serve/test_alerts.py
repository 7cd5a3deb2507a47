"""Alerts on transitions only, deduplicated per run, retried from the outbox, against a real
local HTTP server that records what it receives."""

from __future__ import annotations

import time

import httpx

from tripwire.serve import ServeConfig
from tripwire.serve.alerts import AlertTarget
from tripwire.store.runs import RunStore

from .conftest import TOKEN, running_service
from .otlp_helpers import loop_spans, protobuf_body, trace_id_of
from .recorder import Recorder, recorder

PB = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}


def _wait(rec: Recorder, n: int, path: str | None = None, timeout: float = 15) -> list[object]:
    deadline = time.monotonic() + timeout
    while len(rec.bodies(path)) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"got {rec.requests}, wanted {n} on {path}")
        time.sleep(0.05)
    return rec.bodies(path)


def _targets(rec: Recorder) -> tuple[AlertTarget, ...]:
    return (
        AlertTarget(kind="webhook", url=rec.url + "/hook"),
        AlertTarget(kind="slack", url=rec.url + "/slack"),
        AlertTarget(kind="pagerduty", url=rec.url + "/pd", routing_key="R0UT1NG"),
    )


def test_a_stuck_run_pages_once_per_target_then_resolves_when_it_ends(sqlite_store: RunStore) -> None:
    with recorder() as rec:
        config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, alerts=_targets(rec))
        spans = loop_spans(9)  # stuck at the 4th call, and stays stuck for 5 more calls
        tools = [s for s in spans if s.name.startswith("execute_tool")]
        root = [s for s in spans if not s.name.startswith("execute_tool")]
        tid = trace_id_of(spans)
        with running_service(config, sqlite_store) as r:
            for span in tools:  # one request per call, as a BatchSpanProcessor flushing often
                assert httpx.post(f"{r.url}/v1/traces", content=protobuf_body([span]), headers=PB).status_code == 200
            hook = _wait(rec, 1, "/hook")
            time.sleep(0.5)  # more stuck calls arrived: still one trigger
            assert len(rec.bodies("/hook")) == 1
            httpx.post(f"{r.url}/v1/traces", content=protobuf_body(root), headers=PB)
            _wait(rec, 2, "/pd")
        trigger = hook[0]
        assert trigger["trace_id"] == tid and trigger["verdict"] == "stuck"
        assert trigger["rule"] == "repetition" and trigger["action"] == "trigger"
        assert "refund policy" not in str(rec.requests)  # no arguments in any alert
        slack = rec.bodies("/slack")
        assert len(slack) == 2 and "stuck" in slack[0]["text"]
        pd = rec.bodies("/pd")
        assert [p["event_action"] for p in pd] == ["trigger", "resolve"]
        assert {p["dedup_key"] for p in pd} == {f"tripwire-{tid}"}
        assert pd[0]["routing_key"] == "R0UT1NG"
        assert pd[0]["payload"]["severity"] == "error"
        assert "summary" in pd[0]["payload"] and "source" in pd[0]["payload"]


def test_a_failing_peer_is_retried_with_backoff_from_the_outbox(sqlite_store: RunStore) -> None:
    with recorder(fail_first=2) as rec:
        config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, alerts=(AlertTarget(kind="webhook", url=rec.url + "/hook"),))
        with running_service(config, sqlite_store) as r:
            r.service.sender.base_delay_s = 0.1
            httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(4)[:-1]), headers=PB)
            bodies = _wait(rec, 3, "/hook")
        # Two refusals, then delivered: three identical attempts, and the outbox says so.
        assert bodies[0] == bodies[1] == bodies[2]
        rows = sqlite_store.outbox()
        assert len(rows) == 1 and rows[0]["attempts"] == 2 and rows[0]["delivered_at"] is not None


def test_an_alert_written_before_a_crash_is_sent_by_the_next_start(sqlite_store: RunStore) -> None:
    with recorder() as rec:
        targets = (AlertTarget(kind="webhook", url=rec.url + "/hook"),)
        # First life: no sender runs (as if the process died right after acknowledging).
        from tripwire.serve.app import Service

        dead = Service(ServeConfig(tokens=(TOKEN,), reorder_s=0.0, alerts=targets), store=sqlite_store)
        out = dead.process([], time.time())
        from tripwire.serve.otlp import decode_request

        views = decode_request(protobuf_body(loop_spans(4)[:-1]), "application/x-protobuf").views
        out = dead.process(views, time.time())
        dead._apply_urgent(out)
        assert len(sqlite_store.outbox()) == 1 and rec.bodies() == []
        # Second life: the sender finds the alert still due and delivers it.
        config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, alerts=targets)
        with running_service(config, sqlite_store):
            bodies = _wait(rec, 1, "/hook")
        assert bodies[0]["verdict"] == "stuck"


def test_healthy_runs_page_nobody(sqlite_store: RunStore) -> None:
    with recorder() as rec:
        config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, alerts=(AlertTarget(kind="webhook", url=rec.url + "/hook"),))
        with running_service(config, sqlite_store) as r:
            httpx.post(f"{r.url}/v1/traces", content=protobuf_body(loop_spans(3)), headers=PB)
            time.sleep(0.6)
        assert rec.requests == []
        assert sqlite_store.outbox() == []
