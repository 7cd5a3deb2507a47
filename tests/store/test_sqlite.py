"""The SQLite idempotency store: atomic claims, and records that survive a process restart."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from tripwire.core.reasons import StopReason
from tripwire.errors import ConfigError, RunStopped
from tripwire.idempotency import Idempotent
from tripwire.store.base import Record, StoreUnavailable
from tripwire.store.sqlite import SQLiteIdempotencyStore


def test_claim_complete_release(tmp_path: Path) -> None:
    store = SQLiteIdempotencyStore(tmp_path / "ops.db")
    assert store.claim("op-1") is None
    assert store.claim("op-1") == Record("pending")
    store.complete("op-1", b'{"id":1}')
    assert store.claim("op-1") == Record("done", b'{"id":1}')
    assert store.claim("op-2") is None
    store.release("op-2")
    assert store.claim("op-2") is None  # released: claimable again
    store.release("op-1")  # a done record is never released
    assert store.claim("op-1") == Record("done", b'{"id":1}')
    store.close()


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from tripwire.idempotency import idempotent
    from tripwire.store.sqlite import SQLiteIdempotencyStore

    db, log = sys.argv[1], sys.argv[2]

    @idempotent(SQLiteIdempotencyStore(db))
    def send_email(to, subject):
        with open(log, "a") as fh:
            fh.write(to + "\\n")
        return {"message_id": "m-" + to}

    result = send_email(to="a@example.com", subject="Your receipt")
    print(json.dumps({"status": result.status, "value": result.value}))
    """
)


def test_idempotency_survives_a_process_restart(tmp_path: Path) -> None:
    db, log = tmp_path / "ops.db", tmp_path / "sent.log"
    script = tmp_path / "agent.py"
    script.write_text(SCRIPT)
    outputs = []
    for _ in range(2):  # two separate processes: the second is the "restarted" agent
        done = subprocess.run(
            [sys.executable, str(script), str(db), str(log)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    assert outputs[0] == '{"status": "executed", "value": {"message_id": "m-a@example.com"}}'
    assert outputs[1] == '{"status": "already_sent", "value": {"message_id": "m-a@example.com"}}'
    assert log.read_text() == "a@example.com\n"  # acted once


# --- issue 16: a locked database ---------------------------------------------------------------


def hold_lock(db: Path) -> sqlite3.Connection:
    """Another process's write lock: a real connection inside BEGIN EXCLUSIVE."""
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN EXCLUSIVE")
    return other


def row(db: Path, op: str) -> tuple[str, bytes | None] | None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        found = conn.execute(
            "SELECT state, payload FROM tripwire_idempotency WHERE operation_id = ?", (op,)
        ).fetchone()
    return None if found is None else (found[0], found[1])


def test_a_locked_database_is_the_documented_error_and_nothing_runs(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteIdempotencyStore(db, busy_timeout_s=0.05)
    runs: list[str] = []
    tool = Idempotent(lambda to: runs.append(to), store=store, tool="send_email")
    other = hold_lock(db)
    try:
        with pytest.raises(StoreUnavailable) as info:
            store.claim("op-1")
        assert "locked" in info.value.detail and "busy_timeout_s=0.05" in info.value.detail
        with pytest.raises(RunStopped) as stopped:
            tool("a@example.com")
        assert stopped.value.reason is StopReason.TOOL_ERROR
        assert "not running it now" in str(stopped.value)
    finally:
        other.rollback()
        other.close()
    assert runs == []
    assert tool("a@example.com").status == "executed"


def test_a_lock_between_the_action_and_the_record_is_waited_out(tmp_path: Path) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteIdempotencyStore(db, busy_timeout_s=0.05)
    locks: list[sqlite3.Connection] = []

    def send(to: str) -> dict[str, str]:
        other = hold_lock(db)  # lands after the claim, before the record
        locks.append(other)
        threading.Timer(0.3, other.rollback).start()
        return {"message_id": "m-1"}

    tool = Idempotent(send, store=store, tool="send_email", record_wait_s=10)
    first = tool("a@example.com")
    assert first.status == "executed"
    assert row(db, first.operation_id) == ("done", b'{"message_id":"m-1"}')
    again = Idempotent(send, store=SQLiteIdempotencyStore(db), tool="send_email")
    assert again("a@example.com").value == {"message_id": "m-1"}
    assert len(locks) == 1
    locks[0].close()


def test_a_lock_that_outlasts_the_wait_keeps_the_result_and_records_it_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "ops.db"
    store = SQLiteIdempotencyStore(db, busy_timeout_s=0.02)
    locks: list[sqlite3.Connection] = []
    sent: list[str] = []

    def send(to: str) -> dict[str, str]:
        sent.append(to)
        locks.append(hold_lock(db))
        return {"message_id": f"m-{len(sent)}"}

    tool = Idempotent(send, store=store, tool="send_email", record_wait_s=0.1)
    with caplog.at_level(logging.WARNING, logger="tripwire.idempotency"):
        first = tool("a@example.com")  # acted; the record cannot be written yet
    assert (first.status, first.value) == ("executed", {"message_id": "m-1"})
    assert "could not be recorded" in caplog.text and "ran" in caplog.text
    # While the lock holds: this process replays the result it kept, without acting.
    again = tool("a@example.com")
    assert (again.status, again.value) == ("already_sent", {"message_id": "m-1"})
    locks[0].rollback()
    # The next call writes the kept record; a restarted process then sees it.
    tool("b@example.com")
    locks[1].rollback()
    assert row(db, first.operation_id) == ("done", b'{"message_id":"m-1"}')
    restarted = Idempotent(send, store=SQLiteIdempotencyStore(db), tool="send_email")
    assert restarted("a@example.com").value == {"message_id": "m-1"}
    assert sent == ["a@example.com", "b@example.com"]
    for conn in locks:
        conn.close()


@pytest.mark.parametrize(
    "result",
    [10**5000, "\ud800", "cycle"],
    ids=["huge-int", "lone-surrogate", "cycle"],
)
def test_an_unencodable_result_completes_the_row_in_the_file(tmp_path: Path, result: Any) -> None:
    db = tmp_path / "ops.db"
    if result == "cycle":
        result = []
        result.append(result)
    runs: list[int] = []

    def act() -> Any:
        runs.append(1)
        return result

    tool = Idempotent(act, store=SQLiteIdempotencyStore(db), tool="act")
    first = tool()
    assert first.status == "executed" and first.value is result
    found = row(db, first.operation_id)
    assert found is not None and found[0] == "done"  # not pending for good
    again = Idempotent(act, store=SQLiteIdempotencyStore(db), tool="act")()
    assert (again.status, again.value_stored) == ("already_sent", False)
    assert runs == [1]


def test_busy_timeout_is_validated(tmp_path: Path) -> None:
    for bad in (-1, float("nan"), "5"):
        with pytest.raises(ConfigError) as info:
            SQLiteIdempotencyStore(tmp_path / "x.db", busy_timeout_s=bad)  # type: ignore[arg-type]
        assert info.value.field == "busy_timeout_s"


def test_a_file_that_is_not_a_database_is_the_documented_error(tmp_path: Path) -> None:
    bad = tmp_path / "ops.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreUnavailable) as info:
        SQLiteIdempotencyStore(bad)
    assert str(bad) in str(info.value)
