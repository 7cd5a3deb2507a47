"""``tripwire.otel.instrument(endpoint=..., token=...)``: spans reach a real ``tripwire serve``
without a flush, annotated, with the token; the settings it refuses."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tripwire.otel
from tripwire.errors import ConfigError
from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore

from .conftest import TOKEN, Running, running_service

AUTH = {"Authorization": f"Bearer {TOKEN}"}
LOOSE = {"threshold": 40, "window": 64, "same_result": 40, "same_error": 40, "revisit": 40}


@pytest.fixture
def live(sqlite_store: RunStore) -> Iterator[Running]:
    with running_service(ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05), sqlite_store) as r:
        yield r


def _loop(provider: TracerProvider, calls: int) -> str:
    tracer = provider.get_tracer("test-agent")
    with tracer.start_as_current_span(
        "invoke_agent looper",
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"},
    ) as root:
        for i in range(calls):
            with tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    "gen_ai.tool.call.id": f"call_{i}",
                    "gen_ai.tool.call.arguments": json.dumps({"query": "refund policy"}),
                    "gen_ai.tool.call.result": "No results.",
                },
            ):
                pass
        return f"{root.get_span_context().trace_id:032x}"


def _flag(r: Running, tid: str, within: float) -> dict[str, object] | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        flag = httpx.get(f"{r.url}/api/flags/{tid}", headers=AUTH).json()["flag"]
        if flag is not None:
            return flag  # type: ignore[no-any-return]
        time.sleep(0.02)
    return None


def test_spans_reach_the_service_without_a_flush(live: Running) -> None:
    provider = TracerProvider()
    try:
        tripwire.otel.instrument(provider=provider, endpoint=live.url, token=TOKEN, **LOOSE)
        tid = _loop(provider, 4)
        # No force_flush, no shutdown: the exporter sent the 4 calls on its own, and the
        # service flagged the run (the local policy is too loose to have stopped it).
        flag = _flag(live, tid, within=20)
        assert flag is not None and flag["hits"] == 4 and flag["tool"] == "search_docs"
    finally:
        provider.shutdown()


def test_the_token_comes_from_the_environment_and_a_wrong_one_is_refused(live: Running) -> None:
    good = TracerProvider()
    bad = TracerProvider()
    try:
        tripwire.otel.instrument(provider=good, endpoint=live.url + "/v1/traces", env={"TRIPWIRE_TOKEN": TOKEN}, **LOOSE)
        tripwire.otel.instrument(provider=bad, endpoint=live.url, env={"TRIPWIRE_TOKEN": "not-the-token"}, **LOOSE)
        tid_good, tid_bad = _loop(good, 4), _loop(bad, 4)
        assert _flag(live, tid_good, within=20) is not None
        bad.force_flush()
        assert _flag(live, tid_bad, within=0.5) is None  # its requests got 401
    finally:
        good.shutdown()
        bad.shutdown()


def test_export_processor_is_a_batch_processor_with_the_short_delay() -> None:
    processor = tripwire.otel.export_processor("http://127.0.0.1:9/", token="t")
    try:
        assert isinstance(processor, BatchSpanProcessor)
        assert tripwire.otel.EXPORT_DELAY_MS == 25
    finally:
        processor.shutdown()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"endpoint": "127.0.0.1:4318"}, "endpoint"),
        ({"endpoint": "http://127.0.0.1:4318", "inner": "x"}, "endpoint"),
        ({"token": "t"}, "token"),
    ],
)
def test_refused_settings_are_named(kwargs: dict[str, object], named: str) -> None:
    if "inner" in kwargs:
        kwargs["inner"] = SimpleSpanProcessor(InMemorySpanExporter())
    with pytest.raises(ConfigError) as err:
        tripwire.otel.instrument(provider=TracerProvider(), **kwargs)  # type: ignore[arg-type]
    assert named in str(err.value)
    with pytest.raises(ConfigError, match="schedule_delay_ms"):
        tripwire.otel.export_processor("http://127.0.0.1:4318", schedule_delay_ms=0)
