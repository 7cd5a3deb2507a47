"""A receiver killed with SIGKILL loses nothing it acknowledged: the write-ahead spool is
replayed at the next start (real ``tripwire serve`` processes, a real SQLite store)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tripwire.store.runs import RunStore

from .conftest import free_port
from .otlp_helpers import loop_spans, protobuf_body
from .service_process import serve_process, stop, wait_ready

TOKEN = "crash-token-0123456789abcdef"


def _run_killed_and_restarted(tmp_path: Path, spool: str) -> RunStore:
    db = tmp_path / "runs.db"
    port = free_port()
    args = ["--port", str(port), "--store", f"sqlite:///{db}", "--spool", spool,
            # spans wait 10 s in the reorder buffer: at the kill, nothing of them is judged yet
            "--reorder-ms", "10000", "--webhook", "http://127.0.0.1:9/unreachable", "--log-format", "text"]
    env = {"TRIPWIRE_TOKEN": TOKEN}
    proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
    try:
        wait_ready(port, proc)
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
        got = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=protobuf_body(loop_spans(6)), headers=headers, timeout=10)
        assert got.status_code == 200, got.text
    finally:
        stop(proc, kill=True)
    assert proc.returncode == -9
    # The restarted receiver (short reorder wait now) replays what the killed one accepted.
    args[args.index("10000")] = "0"
    proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
    store = RunStore.open(f"sqlite:///{db}")
    try:
        wait_ready(port, proc)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not store.runs()[1]:
            time.sleep(0.1)
    finally:
        stop(proc)
    return store


def test_acknowledged_spans_survive_sigkill(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    store = _run_killed_and_restarted(tmp_path, str(spool))
    try:
        rows, total = store.runs()
        assert total == 1, (tmp_path / "serve.log").read_text()
        run = rows[0]
        # Judged after the restart: the loop caught, the run ended with its root span, its
        # receipt written, the alert in the outbox (sent or not, it is not lost).
        assert run.verdict == "stuck" and run.status == "ended" and run.receipt is not None
        assert run.tool_calls == 6
        actions = [row["action"] for row in store.outbox()]
        assert "trigger" in actions
        assert "replayed 1 spooled requests" in (tmp_path / "serve.log").read_text()
    finally:
        store.dispose()
    # The graceful stop after the replay emptied the spool, and removed it.
    assert not spool.exists()


def test_without_the_spool_a_sigkill_loses_the_buffered_spans(tmp_path: Path) -> None:
    # The control: the same kill, spool off: the acknowledged spans were only in memory.
    store = _run_killed_and_restarted(tmp_path, "off")
    try:
        assert store.runs()[1] == 0
    finally:
        store.dispose()


def test_a_torn_record_ends_the_replay_of_its_segment(tmp_path: Path) -> None:
    from tripwire.serve.spool import Spool

    spool = Spool(tmp_path / "s")
    spool.append(1.0, "application/json", None, b'{"resourceSpans": []}')
    spool.append(2.0, "application/x-protobuf", "gzip", b"\x1f\x8b rest")
    spool.close()
    segment = next((tmp_path / "s").glob("seg-*.log"))
    data = segment.read_bytes()
    segment.write_bytes(data[:-3])  # the process died in the middle of the second write
    again = Spool(tmp_path / "s")
    entries = list(again.pending())
    assert [(e.at, e.kind, e.encoding) for e in entries] == [(1.0, "application/json", None)]
    with pytest.raises(RuntimeError, match="in use"):
        Spool(tmp_path / "s")  # one receiver per spool
    again.close()


def test_the_spool_holding_raw_bodies_is_readable_by_the_service_user_only(tmp_path: Path) -> None:
    import stat

    from tripwire.serve.spool import Spool

    (tmp_path / "s").mkdir(mode=0o755)  # made by someone else, too open: tightened
    spool = Spool(tmp_path / "s")
    spool.append(1.0, "application/json", None, b'{"resourceSpans": []}')
    segment = next((tmp_path / "s").glob("seg-*.log"))
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700
    assert stat.S_IMODE(segment.stat().st_mode) == 0o600
    spool.close()
