"""The service keys the digests it stores with the fleet's own key (made on first start, kept in
the run store), so a short secret in a tool argument cannot be recovered from its digest by
guessing; every receiver of one store and every restart share the key."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.serve import ServeConfig, Service
from tripwire.store.runs import RunStore

from .conftest import TOKEN, running_service
from .otlp_helpers import protobuf_body, trace_id_of


def _pin_spans(pin: str) -> tuple[object, ...]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("tests").start_as_current_span("execute_tool unlock", attributes={
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "unlock", "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.call.arguments": json.dumps({"pin": pin}),
    }):
        pass
    provider.shutdown()
    return tuple(exporter.get_finished_spans())


def test_stored_digests_are_keyed_by_a_key_the_store_keeps(tmp_path: Path) -> None:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
        with running_service(config, store) as r:
            spans = _pin_spans("482913")
            tid = trace_id_of(spans)
            headers = {"Content-Type": "application/x-protobuf", **r.headers()}
            assert httpx.post(f"{r.url}/v1/traces", content=protobuf_body(spans), headers=headers).status_code == 200  # type: ignore[arg-type]
            deadline = time.monotonic() + 10
            calls: list[dict[str, object]] = []
            while not calls and time.monotonic() < deadline:
                calls = httpx.get(f"{r.url}/api/runs/{tid}", headers=r.headers()).json().get("calls", [])
                time.sleep(0.05)
            used = r.service.normalizer
        (call,) = calls
        # What anyone could compute for a guessed PIN is not what the store holds...
        guessed = DEFAULT_NORMALIZER.signature("unlock", {"pin": "482913"}).digest
        assert call["digest"] != guessed
        # ...what the fleet's key gives is, and the key is the store's, kept across restarts.
        key = store.fleet_key(0.0)
        assert len(key) == 32 and used.key == key
        assert call["digest"] == Normalizer(key=key).signature("unlock", {"pin": "482913"}).digest
        assert "keyed" in used.version and key.hex() not in used.version
        again = Service(config, store=store)
        assert again.normalizer.key == key and again.normalizer.version == used.version
        # Nothing the API answers shows the key.
        assert key.hex() not in json.dumps(calls)
    finally:
        store.dispose()


def test_a_configured_key_is_kept_and_the_fleet_key_can_be_turned_off(tmp_path: Path) -> None:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        mine = Normalizer(key=b"k" * 32)
        assert Service(ServeConfig(tokens=(TOKEN,), normalizer=mine), store=store).normalizer is mine
        plain = Service(ServeConfig(tokens=(TOKEN,), fleet_key=False), store=store).normalizer
        assert plain.key is None and plain.version == DEFAULT_NORMALIZER.version
    finally:
        store.dispose()


def test_two_stores_get_two_keys_and_one_store_one(tmp_path: Path) -> None:
    a = RunStore.open(f"sqlite:///{tmp_path / 'a.db'}")
    b = RunStore.open(f"sqlite:///{tmp_path / 'b.db'}")
    try:
        assert a.fleet_key(1.0) == a.fleet_key(2.0) != b.fleet_key(1.0)
    finally:
        a.dispose()
        b.dispose()
