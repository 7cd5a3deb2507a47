"""A restart listens at once: with many runs still ``running`` in the store, the new process
answers ``/healthz`` while it resumes them, tells readiness probes and exporters to wait (503
with ``Retry-After``: stock exporters retry), and takes exports once it has resumed them.
(It used to listen only after resuming every row: 100,000 rows kept ``/v1/traces`` refusing
connections for 54 s, and exporters with shorter retry windows dropped their data.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tripwire.store.runs import Batch, RunRow, RunStore

from .conftest import TOKEN, free_port
from .otlp_helpers import loop_spans, protobuf_body
from .service_process import serve_process, stop

PB = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}


def test_a_restart_listens_at_once_and_takes_exports_once_resumed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore.open(url)
    now = time.time()
    store.write(Batch(runs=[
        RunRow(trace_id=f"{i:032x}", created_at=now, updated_at=now, status="running", tool_calls=3, steps=3)
        for i in range(1, 30_001)
    ]))
    store.dispose()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = serve_process(["--port", str(port), "--store", url, "--spool", str(tmp_path / "spool")], env={"TRIPWIRE_TOKEN": TOKEN})
    try:
        health: dict[str, object] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not health:
            try:
                health = httpx.get(f"{base}/healthz", timeout=1).json()
            except httpx.TransportError:
                time.sleep(0.02)
        # Listening before the 30,000 rows are resumed: alive, not ready, exports told to wait.
        assert health == {"status": "ok", "started": False}
        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 503 and ready.json()["started"] is False
        early = httpx.post(f"{base}/v1/traces", content=protobuf_body(loop_spans(2)), headers=PB, timeout=5)
        assert early.status_code == 503 and early.headers["retry-after"] == "1"
        deadline = time.monotonic() + 120
        while not httpx.get(f"{base}/healthz", timeout=5).json()["started"]:
            assert time.monotonic() < deadline, "the runs were never resumed"
            time.sleep(0.1)
        assert httpx.get(f"{base}/readyz", timeout=5).status_code == 200
        later = httpx.post(f"{base}/v1/traces", content=protobuf_body(loop_spans(2)), headers=PB, timeout=5)
        assert later.status_code == 200, later.text
    finally:
        stop(proc)
