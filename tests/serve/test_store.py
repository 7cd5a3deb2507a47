"""The run store on SQLite and on the real PostgreSQL: one schema, migrated by Alembic, the
same answers from both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tripwire.errors import ConfigError
from tripwire.store.runs import SCHEMA_REVISION, Batch, CallRow, RunRow, RunStore, VerdictRow

PG_URL = os.environ.get("TRIPWIRE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg() -> RunStore:
    try:
        store = RunStore.open(PG_URL)
    except sa.exc.OperationalError as exc:
        message = f"PostgreSQL at {PG_URL} is unreachable ({exc.orig})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{message}; CI=true requires it", pytrace=False)
        pytest.skip(f"SKIPPED, NEEDS A SERVICE: {message}")
    return store


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}") if request.param == "sqlite" else _pg()
    s.truncate()
    yield s
    s.truncate()
    s.dispose()


def _run(tid: str, **kw: object) -> RunRow:
    values: dict[str, object] = {"trace_id": tid, "created_at": 100.0, "updated_at": 100.0}
    values.update(kw)
    return RunRow(**values)  # type: ignore[arg-type]


def test_upsert_keeps_created_at_and_operator_flags(store: RunStore) -> None:
    tid = "a" * 32
    store.write(Batch(runs=[_run(tid, tool_calls=1)]))
    assert store.set_flags(tid, acknowledged=True)
    store.write(Batch(runs=[_run(tid, tool_calls=7, created_at=999.0, updated_at=200.0, verdict="stuck")]))
    row = store.run(tid)
    assert row is not None
    assert (row.tool_calls, row.verdict, row.created_at, row.updated_at) == (7, "stuck", 100.0, 200.0)
    assert row.acknowledged is True  # an upsert never clears what the operator set
    assert store.run("b" * 32) is None


def test_an_ended_run_is_not_turned_back_into_a_running_one(store: RunStore) -> None:
    tid = "e" * 32
    receipt = {"reason": "completed", "counters": {"tool_calls": 3}}
    store.write(Batch(runs=[_run(tid, status="ended", stop_reason="completed", tool_calls=3, receipt=receipt, ended_at=150.0)]))
    # A late write of the run as it was before its end (an older batch, retried) loses.
    store.write(Batch(runs=[_run(tid, status="running", tool_calls=2, updated_at=160.0)]))
    row = store.run(tid)
    assert row is not None
    assert (row.status, row.tool_calls, row.receipt, row.ended_at) == ("ended", 3, receipt, 150.0)
    # A running run is updated as usual, in the same batch as others.
    other = "f" * 32
    store.write(Batch(runs=[_run(other, tool_calls=1), _run(tid, status="running", tool_calls=9)]))
    store.write(Batch(runs=[_run(other, tool_calls=4, verdict="stuck")]))
    again, mine = store.run(other), store.run(tid)
    assert again is not None and (again.tool_calls, again.verdict) == (4, "stuck")
    assert mine is not None and (mine.status, mine.tool_calls) == ("ended", 3)


def test_a_run_that_only_went_quiet_is_running_again_when_a_write_counts_more_than_its_end(store: RunStore) -> None:
    quiet, stopped = "c" * 32, "d" * 32
    receipt = {"reason": None, "end": None, "counters": {"tool_calls": 3}}
    store.write(Batch(runs=[
        _run(quiet, status="ended", tool_calls=3, steps=2, receipt=receipt, ended_at=150.0, updated_at=150.0),
        _run(stopped, status="ended", stop_reason="loop_detected", verdict="stuck", tool_calls=3, ended_at=150.0),
    ]))
    # An older snapshot of the quiet run, retried late, counts no more than its end: it loses,
    # even with a clock that says later.
    store.write(Batch(runs=[_run(quiet, status="running", tool_calls=3, steps=2, updated_at=170.0)]))
    row = store.run(quiet)
    assert row is not None and (row.status, row.receipt, row.ended_at) == ("ended", receipt, 150.0)
    # The run came back (an agent that waited for a person): its next call makes it running.
    store.write(Batch(runs=[
        _run(quiet, status="running", tool_calls=4, steps=2, updated_at=180.0),
        _run(stopped, status="running", tool_calls=9, steps=5, updated_at=180.0),
    ]))
    row = store.run(quiet)
    assert row is not None
    assert (row.status, row.tool_calls, row.receipt, row.ended_at, row.updated_at) == ("running", 4, None, None, 180.0)
    # A run a stop ended stays ended, whatever comes after.
    held = store.run(stopped)
    assert held is not None and (held.status, held.tool_calls, held.stop_reason) == ("ended", 3, "loop_detected")


def test_filters_pagination_and_counts(store: RunStore) -> None:
    rows = [
        _run(f"{i:032x}", agent="a" if i % 2 else "b", verdict="stuck" if i % 3 == 0 else "working", created_at=float(i), updated_at=float(i))
        for i in range(1, 11)
    ]
    store.write(Batch(runs=rows))
    stuck, total = store.runs(verdict="stuck")
    assert total == 3 and [r.trace_id for r in stuck] == [f"{i:032x}" for i in (9, 6, 3)]
    page, total = store.runs(limit=4, offset=4)
    assert total == 10 and [r.created_at for r in page] == [6.0, 5.0, 4.0, 3.0]
    only_a, total = store.runs(agent="a", since=5.0)
    assert total == 3 and {r.trace_id for r in only_a} == {f"{i:032x}" for i in (5, 7, 9)}
    assert store.counts_by_verdict() == {"stuck": 3, "working": 7}


def test_verdict_history_calls_and_their_bound(store: RunStore) -> None:
    tid = "c" * 32
    store.write(
        Batch(
            runs=[_run(tid)],
            verdicts=[
                VerdictRow(trace_id=tid, at=1.0, verdict="stuck", rule="repetition", call_index=4, hits=4, reason="r1"),
                VerdictRow(trace_id=tid, at=2.0, verdict="working", previous="stuck", call_index=15, reason="r2"),
            ],
            calls=[CallRow(trace_id=tid, call_index=i, tool="t", digest=f"{i:x}") for i in range(1, 601)],
        )
    )
    assert [v.verdict for v in store.verdicts(tid)] == ["stuck", "working"]
    calls = store.calls(tid)
    assert len(calls) == 500 and calls[0].call_index == 101 and calls[-1].call_index == 600
    # A call written again (the same index) replaces the old row.
    store.write(Batch(calls=[CallRow(trace_id=tid, call_index=600, tool="t", digest="new")]))
    assert store.calls(tid)[-1].digest == "new"


def test_outbox_is_deduplicated_and_backs_off(store: RunStore) -> None:
    tid = "d" * 32
    alert = ("k1", tid, "0:webhook", "trigger", {"at": 10.0, "summary": "s"})
    store.write(Batch(alerts=[alert]))
    store.write(Batch(alerts=[alert]))  # the same transition written twice: one row
    due = store.due_alerts(now=10.0)
    assert len(due) == 1 and due[0].payload == {"at": 10.0, "summary": "s"}
    store.alert_failed(due[0].id, 1, 20.0, "HTTP 500", now=10.0)
    assert store.due_alerts(now=15.0) == []
    assert len(store.due_alerts(now=20.0)) == 1
    store.alert_done(due[0].id, now=21.0)
    assert store.due_alerts(now=100.0) == []


def test_kill_flags_expire(store: RunStore) -> None:
    tid = "e" * 32
    store.raise_flag(tid, "loop_detected", "{}", now=100.0, ttl_s=10.0)
    assert store.flag(tid, now=105.0) is not None
    assert store.flag(tid, now=111.0) is None
    assert store.clear_flag(tid) is True
    assert store.clear_flag(tid) is False


def test_migrations_are_recorded_and_a_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore.open(url)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM tripwire_alembic_version")).scalar_one() == SCHEMA_REVISION
    RunStore.open(url).dispose()  # opening again is a no-op upgrade
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE tripwire_alembic_version SET version_num = '9999'"))
    store.dispose()
    with pytest.raises(ConfigError) as info:
        RunStore.open(url)
    assert "newer tripwire" in str(info.value)


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("PRAGMA journal_mode")).scalar_one() == "wal"


def test_a_url_of_another_database_is_a_clear_error() -> None:
    with pytest.raises(ConfigError) as info:
        RunStore.open("mysql://root:secret@127.0.0.1/test")
    assert "secret" not in str(info.value)
    assert "postgresql" in str(info.value)


def test_a_keyed_normalizers_version_fits_in_every_store(store: RunStore) -> None:
    # A keyed normalizer's version is longer than 40 characters: PostgreSQL refused every run
    # row once the service keyed its digests (SQLite does not check lengths).
    from tripwire.core.signature import Normalizer

    version = Normalizer(key=b"k" * 32, volatile_keys=frozenset({"request_id", "trace", "nonce_x"})).version
    assert len(version) > 40
    tid = "d" * 32
    store.write(Batch(
        runs=[_run(tid, normalizer_version=version, policy_version="p" * 60)],
        verdicts=[VerdictRow(trace_id=tid, at=100.0, verdict="stuck", normalizer_version=version)],
    ))
    row = store.run(tid)
    assert row is not None and row.normalizer_version == version and row.policy_version == "p" * 60
    assert store.verdicts(tid)[0].normalizer_version == version
