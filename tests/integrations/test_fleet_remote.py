"""The agent's side of the kill channel, against a real ``tripwire serve`` app (uvicorn in a
thread, SQLite store): a refused token is an auth error, not an outage; the environment names
the channel without a ``connect()`` and without waiting on the network; ``tripwire.check()``
hands its trace id to the channel, so a run nobody passed to ``tripwire.remote.check()`` is
stopped by the service's flag too."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import tripwire.remote as remote
from serve.conftest import TOKEN, Running, running_service
from serve.otlp_helpers import loop_spans, protobuf_body, trace_id_of
from tripwire.errors import ConfigError, LoopDetected
from tripwire.otel import killswitch
from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore


@pytest.fixture
def svc(tmp_path: object) -> Iterator[Running]:
    store = RunStore.open(f"sqlite:///{tmp_path}/runs.db")
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    try:
        with running_service(config, store) as running:
            yield running
    finally:
        store.dispose()


@pytest.fixture(autouse=True)
def _no_channel(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("TRIPWIRE_URL", "TRIPWIRE_REDIS_URL", "TRIPWIRE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    remote.disconnect()
    yield
    remote.disconnect()
    killswitch.KILL_FLAGS.clear_all()


def test_connect_fails_fast_when_the_service_refuses_the_token(svc: Running) -> None:
    for token in (None, "not-the-token"):
        started = time.monotonic()
        with pytest.raises(ConfigError) as caught:
            remote.connect(url=svc.url, token=token)
        assert time.monotonic() - started < remote.PROBE_TIMEOUT_S + 1
        assert caught.value.field == "TRIPWIRE_TOKEN"
        assert "401" in str(caught.value)
        assert "not-the-token" not in str(caught.value)  # never the token itself
        assert remote.current() is None  # nothing half-started
    assert remote.connect(url=svc.url, token=TOKEN).url == svc.url


def test_an_unreachable_service_at_connect_is_an_outage_not_an_error() -> None:
    # Nothing listens on port 9 of loopback: connect() starts the channel, fail_open goes on.
    channel = remote.connect(url="http://127.0.0.1:9", token="x", poll_s=0.05)
    channel.check("ab" * 16)
    time.sleep(0.3)
    channel.check("ab" * 16)


def test_a_refusal_after_connect_is_logged_once_as_such_and_stops_fail_open(
    svc: Running, caplog: pytest.LogCaptureFixture
) -> None:
    channel = remote.RemoteKill(url=svc.url, token="revoked", poll_s=0.05)  # no probe
    try:
        with caplog.at_level(logging.WARNING, logger="tripwire.remote"):
            channel.check("ab" * 16)  # watched from now: the next poll is refused
            deadline = time.monotonic() + 5
            while channel._refused_status is None and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)  # several more refused polls
            with pytest.raises(ConfigError) as caught:
                channel.check("ab" * 16)
        assert caught.value.field == "TRIPWIRE_TOKEN"
        said = [r.getMessage() for r in caplog.records if r.name == "tripwire.remote"]
        refused = [m for m in said if "refused the token" in m]
        assert len(refused) == 1, said
        assert "TRIPWIRE_TOKEN" in refused[0] and "HTTP 401" in refused[0]
        assert not [m for m in said if "unreachable" in m], said
    finally:
        channel.close()


def test_the_environment_names_the_channel_without_connect_and_without_blocking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A black-hole address: a blocking connect would take seconds here.
    monkeypatch.setenv("TRIPWIRE_URL", "http://10.255.255.1:4318")
    monkeypatch.setenv("TRIPWIRE_TOKEN", "t")
    started = time.monotonic()
    remote.check("ab" * 16)
    killswitch.check("cd" * 16)
    assert time.monotonic() - started < 0.2
    channel = remote.current()
    assert channel is not None and channel.url == "http://10.255.255.1:4318"
    assert channel.token == "t"
    assert {"ab" * 16, "cd" * 16} <= set(channel._watched)


def test_tripwire_check_is_stopped_by_a_service_flag_it_alone_asked_about(svc: Running) -> None:
    spans = loop_spans(6)
    tid = trace_id_of(spans)
    remote.connect(url=svc.url, token=TOKEN, poll_s=0.05)
    killswitch.check(tid)  # the run's first step: nothing flagged, and the trace is watched
    got = httpx.post(
        f"{svc.url}/v1/traces",
        content=protobuf_body(spans),
        headers={**svc.headers(), "Content-Type": "application/x-protobuf"},
        timeout=10,
    )
    assert got.status_code == 200, got.text
    deadline = time.monotonic() + 10
    with pytest.raises(LoopDetected) as caught:
        while time.monotonic() < deadline:
            killswitch.check(tid)
            time.sleep(0.05)
    assert caught.value.tool == "search_docs"
