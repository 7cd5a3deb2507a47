"""An exporter that retries an export request the receiver had applied (its answer timed out,
or was lost) gets 200, and the spans count once: three identical calls without call ids, sent
twice, stay three calls, not six (a false loop). Real servers, real HTTP, real Redis."""

from __future__ import annotations

import gzip
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tripwire.serve import ServeConfig
from tripwire.serve.shared_state import LOG_PREFIX
from tripwire.store.runs import RunStore

from .conftest import TOKEN, Running, running_service
from .otlp_helpers import json_body, loop_spans, protobuf_body, trace_id_of

REDIS_URL = "redis://127.0.0.1:6379/0"


def _three_calls() -> tuple[Any, str]:
    # No root span (the run goes on) and no call ids (a hand-written loop): only the request's
    # own identity can tell a retry from three more calls.
    spans = [s for s in loop_spans(3, call_ids=False) if s.parent is not None]
    return spans, trace_id_of(spans)


def _post(r: Running, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{r.url}/v1/traces", content=body, headers={**headers, **r.headers()}, timeout=10)


def _run(r: Running, trace_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        got = httpx.get(f"{r.url}/api/runs/{trace_id}", headers=r.headers())
        if got.status_code == 200 and got.json().get("tool_calls") is not None:
            body: dict[str, Any] = got.json()
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"run {trace_id} was never written: {got.text[:300]}")
        time.sleep(0.05)


def _settled(r: Running, trace_id: str) -> dict[str, Any]:
    time.sleep(0.3)  # past a few write ticks: what is written is all there is
    return _run(r, trace_id)


@pytest.mark.parametrize("encoding", ["protobuf", "json-gzip"])
def test_a_retried_request_is_acknowledged_and_counted_once(service: Running, encoding: str) -> None:
    spans, trace_id = _three_calls()
    if encoding == "protobuf":
        first = second = protobuf_body(spans)
        headers = {"Content-Type": "application/x-protobuf"}
    else:
        data = json_body(spans)
        first = gzip.compress(data, mtime=1)  # each attempt gzipped anew: other bytes, same spans
        second = gzip.compress(data, mtime=2)
        assert first != second
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    assert _post(service, first, headers).status_code == 200
    assert _run(service, trace_id)["tool_calls"] == 3
    retried = _post(service, second, headers)
    assert retried.status_code == 200, retried.text
    run = _settled(service, trace_id)
    assert run["tool_calls"] == 3 and run["verdict"] != "stuck", run
    metrics = httpx.get(f"{service.url}/metrics", headers=service.headers()).text
    assert "tripwire_spans_duplicate_total 3.0" in metrics


def test_the_same_spans_in_a_new_request_are_still_new_calls_when_they_differ(service: Running) -> None:
    # Not a blanket "seen this trace" filter: a later request of the same run counts.
    spans, trace_id = _three_calls()
    headers = {"Content-Type": "application/x-protobuf"}
    assert _post(service, protobuf_body(spans[:2]), headers).status_code == 200
    assert _post(service, protobuf_body(spans[2:]), headers).status_code == 200
    assert _settled(service, trace_id)["tool_calls"] == 3


def test_a_request_that_was_not_applied_is_applied_when_retried(sqlite_store: RunStore) -> None:
    # Redis-state receiver whose Redis is unreachable: 503, nothing applied, nothing claimed
    # (the claim itself needs Redis); the same request later, to a receiver that can apply it,
    # is applied.
    spans, trace_id = _three_calls()
    body = protobuf_body(spans)
    headers = {"Content-Type": "application/x-protobuf"}
    down = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, state="redis",
                       redis_url="redis://127.0.0.1:1/0")  # fmt: skip
    with running_service(down, sqlite_store) as r:
        got = _post(r, body, headers)
        assert got.status_code == 503 and got.headers["Retry-After"]
    up = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(up, sqlite_store) as r:
        assert _post(r, body, headers).status_code == 200
        assert _settled(r, trace_id)["tool_calls"] == 3


def test_a_retry_that_reaches_another_receiver_counts_once(tmp_path: Path, redis_client: Any) -> None:
    # State in Redis, two receivers behind a load balancer: the first attempt to one, the
    # retry to the other.
    spans, trace_id = _three_calls()
    body = protobuf_body(spans)
    headers = {"Content-Type": "application/x-protobuf"}
    redis_client.delete(LOG_PREFIX + trace_id)
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, state="redis", redis_url=REDIS_URL)
    stores = [RunStore.open(f"sqlite:///{tmp_path / f'runs{i}.db'}") for i in range(2)]
    try:
        with running_service(config, stores[0]) as a, running_service(config, stores[1]) as b:
            assert _post(a, body, headers).status_code == 200
            assert redis_client.llen(LOG_PREFIX + trace_id) == 3
            assert _post(b, body, headers).status_code == 200
            assert redis_client.llen(LOG_PREFIX + trace_id) == 3  # not appended again
            assert _settled(a, trace_id)["tool_calls"] == 3
    finally:
        for store in stores:
            store.dispose()
        redis_client.delete(LOG_PREFIX + trace_id)
