"""A receiver killed with SIGKILL loses nothing it acknowledged: the write-ahead spool is
replayed at the next start (real ``tripwire serve`` processes, a real SQLite store)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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

_ENV = {"TRIPWIRE_TOKEN": TOKEN}
_HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}


def _six_calls_and_a_root() -> tuple[list[Any], list[Any], str]:
    """Six identical calls without call ids, in start order, the run's root span, its trace id."""
    spans = loop_spans(6, call_ids=False)
    calls = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time)
    return calls, [s for s in spans if s.parent is None], f"{spans[0].context.trace_id:032x}"


def _spooled_receiver(tmp_path: Path) -> tuple[int, list[str]]:
    """A port and the ``tripwire serve`` arguments: SQLite store and spool in ``tmp_path``, no
    reorder wait."""
    port = free_port()
    return port, ["--port", str(port), "--store", f"sqlite:///{tmp_path / 'runs.db'}", "--spool",
                  str(tmp_path / "spool"), "--reorder-ms", "0", "--log-format", "text"]  # fmt: skip


@pytest.mark.parametrize("first_request", ["let go by the spool", "still in the spool"])
def test_a_run_going_on_across_a_restart_goes_on_counting(tmp_path: Path, first_request: str) -> None:
    # Its first 3 calls are judged and written; the receiver is killed; its last 3 calls and
    # its root span come to the restarted receiver. Six calls, their rows numbered 1 to 6:
    # not three (the restarted receiver starting the run afresh and rewriting its row and its
    # first three call rows, when the spool had let the first request go), nor nine (the
    # replay counting again what the row holds, when it had not).
    calls, root, trace_id = _six_calls_and_a_root()
    port, args = _spooled_receiver(tmp_path)
    env, headers = _ENV, _HEADERS
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
        try:
            wait_ready(port, proc)
            got = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=protobuf_body(calls[:3]), headers=headers, timeout=10)
            assert got.status_code == 200, got.text
            # Written, and (or not yet) its spool segment deleted (segments turn over every
            # second; the open one is then empty).
            let_go = first_request == "let go by the spool"
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                row = store.run(trace_id)
                spooled = sum(f.stat().st_size for f in (tmp_path / "spool").glob("seg-*"))
                if row is not None and row.tool_calls == 3 and (not spooled) == let_go:
                    break
                time.sleep(0.02 if not let_go else 0.1)
            else:
                raise AssertionError(f"never written ({first_request}): {store.run(trace_id)}")
        finally:
            stop(proc, kill=True)
        assert proc.returncode == -9
        proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
        try:
            wait_ready(port, proc)
            got = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=protobuf_body([*calls[3:], *root]), headers=headers, timeout=10)
            assert got.status_code == 200, got.text
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                row = store.run(trace_id)
                if row is not None and row.status == "ended":
                    break
                time.sleep(0.1)
        finally:
            stop(proc)
        row = store.run(trace_id)
        assert row is not None and row.status == "ended", (tmp_path / "serve.log").read_text()
        assert row.tool_calls == 6
        assert [c.call_index for c in store.calls(trace_id)] == [1, 2, 3, 4, 5, 6]
        log = (tmp_path / "serve.log").read_text()
        if first_request == "still in the spool":  # the case the replay had to leave out
            assert "replayed 1 spooled requests" in log and "3 spooled spans were in their runs' rows" in log, log
    finally:
        store.dispose()


def test_a_run_that_ended_before_the_kill_is_not_rewritten_by_the_replay(tmp_path: Path) -> None:
    # Both requests of a run judged and written, the run ended with its root span; the first
    # request let go by the spool, the second still in it at the kill: the replay must not
    # start the run afresh from the second and rewrite the ended row with 3 calls (and its
    # call rows 1-3 with the last three).
    calls, root, trace_id = _six_calls_and_a_root()
    port, args = _spooled_receiver(tmp_path)
    env, headers = _ENV, _HEADERS
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
        try:
            wait_ready(port, proc)

            def spooled() -> int:
                return sum(f.stat().st_size for f in (tmp_path / "spool").glob("seg-*"))

            def post(part: list[Any]) -> None:
                got = httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=protobuf_body(part), headers=headers, timeout=10)
                assert got.status_code == 200, got.text

            post(calls[:3])
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and spooled():  # the first request let go
                time.sleep(0.05)
            assert not spooled()
            post([*calls[3:], *root])
            while time.monotonic() < deadline:
                row = store.run(trace_id)
                if row is not None and row.status == "ended" and spooled():
                    break
                time.sleep(0.02)
            else:
                raise AssertionError(f"never ended with the spool still holding it: {store.run(trace_id)}")
        finally:
            stop(proc, kill=True)
        first_calls = [c.start_s for c in store.calls(trace_id)]
        assert len(first_calls) == 6
        proc = serve_process(args, env=env, stderr=tmp_path / "serve.log")
        try:
            wait_ready(port, proc)
            deadline = time.monotonic() + 10
            log = tmp_path / "serve.log"
            while time.monotonic() < deadline and "replayed" not in log.read_text():
                time.sleep(0.05)
            time.sleep(0.5)  # past a few write ticks
        finally:
            stop(proc)
        row = store.run(trace_id)
        assert row is not None and row.status == "ended" and row.tool_calls == 6, (row, log.read_text())
        assert [c.start_s for c in store.calls(trace_id)] == first_calls
    finally:
        store.dispose()
