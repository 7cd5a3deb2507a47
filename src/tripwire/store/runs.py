"""The run store: one row per agent run, its receipt, its verdict history and its last calls.

SQLite is the embedded default (a file under the user's data directory, WAL mode);
PostgreSQL is the shared fleet store (``postgresql://…``). Written with SQLAlchemy Core, the
schema migrated with Alembic (``tripwire/store/migrations``): :meth:`RunStore.open` brings a
database to the current revision before it is used, so an older store is upgraded in place and
a newer one is refused with a clear message.

What is stored: digests, counters, verdicts and receipts, never raw tool arguments or results
unless the service runs with ``--store-raw`` (the ``raw`` column of ``calls`` then holds the
arguments text, clipped). Besides the runs, the store holds the alert outbox (alerts are written
in the same transaction as the transition that causes them, and sent afterwards, so a crash
loses none) and, when there is no Redis, the kill flags.

Every method is synchronous and short; the service calls them from a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tripwire.errors import ConfigError

__all__ = [
    "Batch",
    "CallRow",
    "FlagRow",
    "OutboxItem",
    "RunRow",
    "RunStore",
    "VerdictRow",
    "default_store_url",
    "metadata",
]

logger = logging.getLogger("tripwire.store.runs")

SCHEMA_REVISION: Final = "0003"
"""The Alembic revision this code reads and writes (``migrations/versions``)."""
VERSION_TABLE: Final = "tripwire_alembic_version"
"""Alembic's version table for the run store (its own name: the database may hold others)."""

metadata = sa.MetaData()

runs = sa.Table(
    "tripwire_runs",
    metadata,
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("agent", sa.String(200), nullable=True),
    sa.Column("service", sa.String(200), nullable=True),
    sa.Column("status", sa.String(16), nullable=False),  # running | ended
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("rule", sa.String(40), nullable=True),
    sa.Column("stop_reason", sa.String(40), nullable=True),
    sa.Column("health", sa.String(24), nullable=True),
    sa.Column("steps", sa.Integer, nullable=False, default=0),
    sa.Column("tool_calls", sa.Integer, nullable=False, default=0),
    sa.Column("input_tokens", sa.BigInteger, nullable=False, default=0),
    sa.Column("output_tokens", sa.BigInteger, nullable=False, default=0),
    sa.Column("cost_usd", sa.Float, nullable=True),
    sa.Column("duration_s", sa.Float, nullable=True),
    sa.Column("first_stuck_call", sa.Integer, nullable=True),
    sa.Column("calls_after_stuck", sa.Integer, nullable=False, default=0),
    sa.Column("cost_after_stuck", sa.Float, nullable=True),
    sa.Column("killed", sa.Boolean, nullable=False, default=False),
    sa.Column("acknowledged", sa.Boolean, nullable=False, default=False),
    sa.Column("resolved", sa.Boolean, nullable=False, default=False),
    sa.Column("policy_version", sa.String(120), nullable=True),
    sa.Column("normalizer_version", sa.String(120), nullable=True),
    sa.Column("mapping_version", sa.String(16), nullable=True),
    sa.Column("receipt", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("updated_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float, nullable=True),
)
sa.Index("ix_tripwire_runs_created", runs.c.created_at)
sa.Index("ix_tripwire_runs_verdict", runs.c.verdict)
sa.Index("ix_tripwire_runs_agent", runs.c.agent)

verdicts = sa.Table(
    "tripwire_verdicts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("trace_id", sa.String(32), nullable=False, index=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("previous", sa.String(16), nullable=True),
    sa.Column("rule", sa.String(40), nullable=True),
    sa.Column("tool", sa.String(200), nullable=True),
    sa.Column("digest", sa.String(40), nullable=True),
    sa.Column("call_index", sa.Integer, nullable=False, default=0),
    sa.Column("hits", sa.Integer, nullable=False, default=0),
    sa.Column("reason", sa.Text, nullable=False, default=""),
    sa.Column("stop_reason", sa.String(40), nullable=True),
    sa.Column("policy_version", sa.String(120), nullable=True),
    sa.Column("normalizer_version", sa.String(120), nullable=True),
)

calls = sa.Table(
    "tripwire_calls",
    metadata,
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("call_index", sa.Integer, primary_key=True),
    sa.Column("tool", sa.String(200), nullable=False),
    sa.Column("digest", sa.String(40), nullable=True),
    sa.Column("result_digest", sa.String(40), nullable=True),
    sa.Column("error_type", sa.String(100), nullable=True),
    sa.Column("attempt", sa.Integer, nullable=True),
    sa.Column("progress", sa.String(100), nullable=True),
    sa.Column("lease_owner", sa.String(200), nullable=True),
    sa.Column("start_s", sa.Float, nullable=True),
    sa.Column("end_s", sa.Float, nullable=True),
    sa.Column("verdict", sa.String(16), nullable=True),
    sa.Column("raw", sa.Text, nullable=True),
)

outbox = sa.Table(
    "tripwire_outbox",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("dedupe_key", sa.String(200), nullable=False, unique=True),
    sa.Column("trace_id", sa.String(32), nullable=False),
    sa.Column("target", sa.String(40), nullable=False),
    sa.Column("action", sa.String(16), nullable=False),  # trigger | resolve
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("next_at", sa.Float, nullable=False),
    sa.Column("delivered_at", sa.Float, nullable=True),
    sa.Column("failed_at", sa.Float, nullable=True),
    sa.Column("last_error", sa.Text, nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
)
sa.Index("ix_tripwire_outbox_due", outbox.c.delivered_at, outbox.c.next_at)

flags = sa.Table(
    "tripwire_flags",
    metadata,
    sa.Column("trace_id", sa.String(32), primary_key=True),
    sa.Column("reason", sa.String(40), nullable=False),
    sa.Column("message", sa.Text, nullable=False, default=""),
    sa.Column("raised_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
)

secrets_table = sa.Table(
    "tripwire_secrets",
    metadata,
    sa.Column("name", sa.String(40), primary_key=True),
    sa.Column("value", sa.String(256), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

DIGEST_KEY: Final = "digest_key"
"""The name of the fleet's digest key in ``tripwire_secrets``."""

MAX_CALLS_PER_RUN: Final = 500
"""The last calls of a run kept in ``tripwire_calls`` (the dashboard's timeline)."""
MAX_PAGE: Final = 1000
"""The most runs one :meth:`RunStore.runs` call answers with (a larger ``limit`` is cut)."""
MAX_OFFSET: Final = 1 << 62
"""The largest offset :meth:`RunStore.runs` passes on (a larger one is cut: SQLite and
PostgreSQL integers are 64-bit, and no store holds that many runs)."""
MAX_RAW_CHARS: Final = 4096
"""With ``--store-raw``, raw arguments are clipped to this many characters."""


def default_store_url() -> str:
    """``sqlite:///<user data dir>/tripwire/runs.db`` (platformdirs); the folder is created."""
    from platformdirs import user_data_dir

    folder = Path(user_data_dir("tripwire", appauthor=False))
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'runs.db'}"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictRow:
    """One verdict transition of a run."""

    trace_id: str
    at: float
    """Wall-clock time of the transition (Unix seconds)."""
    verdict: str
    previous: str | None = None
    rule: str | None = None
    tool: str | None = None
    digest: str | None = None
    """A signature digest prefix (never arguments)."""
    call_index: int = 0
    hits: int = 0
    reason: str = ""
    stop_reason: str | None = None
    """Set when the transition is a budget stop (``max_tool_calls``…) rather than a verdict."""
    policy_version: str | None = None
    normalizer_version: str | None = None


class CallRow(msgspec.Struct, gc=False):
    """One tool call of a run's timeline (digests only, unless the store keeps raw arguments).

    A ``msgspec.Struct`` (``__struct_fields__`` in declaration order): the receiver builds
    one per tool call it judges, and a Struct's ``__init__`` (in C) costs a quarter of a slotted
    dataclass's with these thirteen keywords, half that again with them passed by position
    (as the receiver does: it must follow any change of the fields' order). Untracked by the
    garbage collector: it holds only strings and numbers, so it can be in no cycle.
    """

    trace_id: str
    call_index: int
    tool: str
    digest: str | None = None
    result_digest: str | None = None
    error_type: str | None = None
    attempt: int | None = None
    progress: str | None = None
    lease_owner: str | None = None
    start_s: float | None = None
    end_s: float | None = None
    verdict: str | None = None
    raw: str | None = None


class RunRow(msgspec.Struct):
    """One run: DESIGN.md's columns plus what the dashboard and the kill channel need.

    A ``msgspec.Struct`` (``__struct_fields__`` in declaration order): the receiver builds one
    per run and request. Build it with keywords; the receiver passes all of them by position,
    in this order (it must follow any change here), because matching 26 keywords costs six
    times the rest of the Struct's ``__init__`` (12.7k instructions against 2.1k).
    """

    trace_id: str
    agent: str | None = None
    service: str | None = None
    status: str = "running"
    verdict: str = "working"
    rule: str | None = None
    stop_reason: str | None = None
    health: str | None = None
    steps: int = 0
    tool_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    duration_s: float | None = None
    first_stuck_call: int | None = None
    calls_after_stuck: int = 0
    cost_after_stuck: float | None = None
    killed: bool = False
    acknowledged: bool = False
    resolved: bool = False
    policy_version: str | None = None
    normalizer_version: str | None = None
    mapping_version: str | None = None
    receipt: dict[str, Any] | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    ended_at: float | None = None

    def as_json(self) -> dict[str, Any]:
        """The run as the ``/api/runs`` JSON object."""
        return {name: getattr(self, name) for name in self.__struct_fields__}


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxItem:
    """One alert waiting to be delivered (or delivered)."""

    id: int
    dedupe_key: str
    trace_id: str
    target: str
    action: str
    payload: dict[str, Any]
    attempts: int
    next_at: float


@dataclass(frozen=True, slots=True)
class FlagRow:
    """A run's kill flag, as the store keeps it when there is no Redis."""

    trace_id: str
    reason: str
    message: str
    """The flag's JSON object (what ``GET /api/flags/<trace_id>`` answers)."""
    raised_at: float
    expires_at: float


@dataclass(slots=True)
class Batch:
    """What one processing step writes, in one transaction (see :meth:`RunStore.write`)."""

    runs: list[RunRow] = field(default_factory=list)
    verdicts: list[VerdictRow] = field(default_factory=list)
    calls: list[CallRow] = field(default_factory=list)
    alerts: list[tuple[str, str, str, str, dict[str, Any]]] = field(default_factory=list)
    """``(dedupe_key, trace_id, target, action, payload)``."""
    killed: list[str] = field(default_factory=list)
    """Runs whose flag went up (their rows' ``killed`` is set, after the rows above)."""
    flags: list[FlagRow] = field(default_factory=list)
    """Kill flags to raise or renew (when the store is the kill channel)."""

    def __bool__(self) -> bool:
        return bool(self.runs or self.verdicts or self.calls or self.alerts or self.killed or self.flags)


_RUN_COLUMNS: Final = tuple(c.name for c in runs.columns)


def _run_values(row: RunRow) -> dict[str, Any]:
    values = {name: getattr(row, name) for name in _RUN_COLUMNS}
    values["receipt"] = json.dumps(row.receipt) if row.receipt is not None else None
    return values


def _row_to_run(mapping: Any) -> RunRow:
    values = dict(mapping)
    text = values.get("receipt")
    values["receipt"] = json.loads(text) if text else None
    return RunRow(**values)


class RunStore:
    """The run store over one SQLAlchemy engine (SQLite file or PostgreSQL).

    Build it with :meth:`open`, which migrates the schema. Thread-safe (SQLAlchemy's pool;
    SQLite writes are serialized by a lock, since SQLite has one writer at a time).
    """

    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        self.dialect = engine.dialect.name
        self._write_lock = threading.Lock() if self.dialect == "sqlite" else None
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as dialect_insert  # type: ignore[assignment, unused-ignore]
        else:
            from sqlalchemy.dialects.postgresql import insert as dialect_insert  # type: ignore[assignment, unused-ignore]
        self._insert: Any = dialect_insert
        self._upserts: dict[str, _Upsert] = {}

    @classmethod
    def open(cls, url: str | None = None, *, migrate: bool = True) -> RunStore:
        """Open (and migrate) the store at ``url``; default the user's SQLite file.

        Raises:
            ConfigError: the URL is not a SQLite or PostgreSQL URL, or names a database whose
                schema is newer than this tripwire.
        """
        url = url or default_store_url()
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://") :]
        elif url.startswith("postgres://"):
            url = "postgresql+psycopg://" + url[len("postgres://") :]
        if not (url.startswith("sqlite:") or url.startswith("postgresql+psycopg://")):
            raise ConfigError(
                "--store", _redact(url), "a sqlite:///path URL or a postgresql://… URL"
            )
        kwargs: dict[str, Any] = {"future": True}
        if url.startswith("sqlite:"):
            kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
        else:
            kwargs["pool_pre_ping"] = True
            kwargs["connect_args"] = {"connect_timeout": 5}
        engine = sa.create_engine(url, **kwargs)
        if url.startswith("sqlite:"):
            _create_private(engine.url.database)
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        store = cls(engine, url)
        if migrate:
            store.migrate()
        return store

    def migrate(self) -> None:
        """Bring the schema to :data:`SCHEMA_REVISION` with Alembic."""
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext

        config = Config()
        config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
        from alembic.script import ScriptDirectory

        known = {rev.revision for rev in ScriptDirectory.from_config(config).walk_revisions()}
        with self.engine.begin() as conn:
            current = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
            if current is not None and current not in known:
                raise ConfigError(
                    "--store",
                    _redact(self.url),
                    f"a store at schema revision {SCHEMA_REVISION} or older (it is at "
                    f"{current}: written by a newer tripwire)",
                )
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def fleet_key(self, now: float) -> bytes:
        """The fleet's digest key (32 random bytes), made and kept on first use: every receiver
        of this store signs and digests with the same key, and a restart keeps it.

        Two receivers starting at once both try to make it; the first one written wins and
        both return it.
        """
        select = sa.select(secrets_table.c.value).where(secrets_table.c.name == DIGEST_KEY)
        with self.engine.connect() as conn:
            found = conn.execute(select).scalar_one_or_none()
        if found is None:
            with contextlib.suppress(sa.exc.IntegrityError), self.engine.begin() as conn:
                conn.execute(
                    secrets_table.insert().values(name=DIGEST_KEY, value=secrets.token_hex(32), created_at=now)
                )
            with self.engine.connect() as conn:
                found = conn.execute(select).scalar_one()
        return bytes.fromhex(found)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def ping(self) -> bool:
        """True when the database answers ``SELECT 1``."""
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            return False

    # -- writes -----------------------------------------------------------------------------

    def write(self, batch: Batch) -> None:
        """Write one processing step in one transaction: run upserts, verdicts, calls, runs'
        ``killed``, kill flags, alerts."""
        if not batch:
            return
        with self._writing() as conn:
            self._write(conn, batch)

    def _upsert(self, table: sa.Table) -> _Upsert:
        """The upsert of ``table``'s rows, compiled once for this store's database."""
        made = self._upserts.get(table.name)
        if made is None:
            stmt = self._insert(table)
            if table is runs:
                stmt = stmt.on_conflict_do_update(
                    index_elements=[runs.c.trace_id],
                    set_={name: stmt.excluded[name] for name in _RUN_COLUMNS if name not in _KEEP_ON_UPDATE},
                    # An ended run is never turned back into a running one by a late, older
                    # write, unless it only went quiet (no stop reason: nothing said how it
                    # ended) and came back: a write that counts more than its end did is newer
                    # (a run's counters only grow), whatever the receivers' clocks say.
                    where=sa.not_(
                        sa.and_(
                            runs.c.status == "ended",
                            stmt.excluded.status == "running",
                            sa.not_(
                                sa.and_(
                                    runs.c.stop_reason.is_(None),
                                    sa.or_(
                                        stmt.excluded.tool_calls > runs.c.tool_calls,
                                        stmt.excluded.steps > runs.c.steps,
                                    ),
                                )
                            ),
                        )
                    ),
                )
            else:
                stmt = stmt.on_conflict_do_update(
                    index_elements=[c for c in table.columns if c.primary_key],
                    set_={c.name: stmt.excluded[c.name] for c in table.columns if not c.primary_key},
                )
            made = self._upserts[table.name] = _Upsert(stmt, table, self.engine.dialect)
        return made

    def _write(self, conn: Connection, batch: Batch) -> None:
        if batch.runs:
            self._upsert(runs).execute(conn, batch.runs, _run_values)
        if batch.verdicts:
            # A transition written again (an exporter retried a request whose run had ended,
            # or the spool was replayed after a crash) is the same row: keep the first.
            key = (verdicts.c.trace_id, verdicts.c.call_index, verdicts.c.verdict, verdicts.c.rule,
                   verdicts.c.stop_reason)
            ids = sorted({v.trace_id for v in batch.verdicts})
            written = {tuple(r) for r in conn.execute(sa.select(*key).where(verdicts.c.trace_id.in_(ids)))}
            fresh = []
            for v in batch.verdicts:
                k = (v.trace_id, v.call_index, v.verdict, v.rule, v.stop_reason)
                if k not in written:
                    written.add(k)
                    fresh.append(_as_dict(v))
            if fresh:
                conn.execute(verdicts.insert(), fresh)
        if batch.calls:
            self._upsert(calls).execute(conn, batch.calls, _as_dict)
            tops: dict[str, int] = {}
            for r in batch.calls:
                if r.call_index > MAX_CALLS_PER_RUN and r.call_index > tops.get(r.trace_id, 0):
                    tops[r.trace_id] = r.call_index
            if tops:
                conn.execute(
                    calls.delete().where(
                        calls.c.trace_id == sa.bindparam("t"),
                        calls.c.call_index <= sa.bindparam("below"),
                    ),
                    [{"t": t, "below": top - MAX_CALLS_PER_RUN} for t, top in tops.items()],
                )
        if batch.killed:
            conn.execute(runs.update().where(runs.c.trace_id.in_(sorted(set(batch.killed)))).values(killed=True))
        if batch.flags:
            self._upsert(flags).execute(conn, batch.flags, _as_dict)
        if batch.alerts:
            stmt = self._insert(outbox).on_conflict_do_nothing(index_elements=[outbox.c.dedupe_key])
            conn.execute(
                stmt,
                [
                    {
                        "dedupe_key": key,
                        "trace_id": trace_id,
                        "target": target,
                        "action": action,
                        "payload": json.dumps(payload),
                        "attempts": 0,
                        "next_at": payload.get("at", 0.0),
                        "created_at": payload.get("at", 0.0),
                    }
                    for key, trace_id, target, action, payload in batch.alerts
                ],
            )

    def mark_killed(self, trace_ids: list[str]) -> None:
        """Set ``killed`` on many runs in one statement (after their flags went up)."""
        self.write(Batch(killed=list(trace_ids)))

    def set_flags(self, trace_id: str, **values: bool) -> bool:
        """Set ``killed`` / ``acknowledged`` / ``resolved`` on a run; False if no such run."""
        allowed = {"killed", "acknowledged", "resolved"}
        bad = set(values) - allowed
        if bad:
            raise ConfigError("flags", sorted(bad), f"some of {sorted(allowed)}")
        with self._writing() as conn:
            result = conn.execute(
                runs.update().where(runs.c.trace_id == trace_id).values(**values)
            )
            return bool(result.rowcount)

    # -- kill flags (when there is no Redis) ---------------------------------------------------

    def raise_flag(self, trace_id: str, reason: str, message: str, now: float, ttl_s: float) -> None:
        """Raise (or renew) the store's kill flag of a run."""
        self.raise_flags([(trace_id, reason, message)], now, ttl_s)

    def raise_flags(self, items: list[tuple[str, str, str]], now: float, ttl_s: float) -> None:
        """Raise (or renew) the kill flags ``(trace_id, reason, message)`` in one transaction."""
        self.write(Batch(flags=[FlagRow(t, r, m, now, now + ttl_s) for t, r, m in items]))

    def clear_flag(self, trace_id: str) -> bool:
        """Lower a run's kill flag; True if one was up."""
        with self._writing() as conn:
            return bool(conn.execute(flags.delete().where(flags.c.trace_id == trace_id)).rowcount)

    def flag(self, trace_id: str, now: float) -> dict[str, Any] | None:
        """The run's kill flag if it is up and not expired."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(flags).where(flags.c.trace_id == trace_id, flags.c.expires_at > now)
            ).first()
        return dict(row._mapping) if row is not None else None

    # -- reads --------------------------------------------------------------------------------

    def run(self, trace_id: str) -> RunRow | None:
        """One run, or ``None``."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.trace_id == trace_id)).first()
        return _row_to_run(row._mapping) if row is not None else None

    def runs_of(self, trace_ids: Iterable[str]) -> list[RunRow]:
        """The rows of these runs (those that have one), any order."""
        ids = list(dict.fromkeys(trace_ids))
        out: list[RunRow] = []
        with self.engine.connect() as conn:
            for i in range(0, len(ids), 500):  # an IN list of bounded length
                query = sa.select(runs).where(runs.c.trace_id.in_(ids[i : i + 500]))
                out += [_row_to_run(r._mapping) for r in conn.execute(query)]
        return out

    def runs(
        self,
        *,
        verdict: str | None = None,
        agent: str | None = None,
        stop_reason: str | None = None,
        health: str | None = None,
        status: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[RunRow], int]:
        """Runs, newest first, filtered; and how many match in all (for pagination)."""
        conditions: list[Any] = []
        for column, value in (
            (runs.c.verdict, verdict),
            (runs.c.agent, agent),
            (runs.c.stop_reason, stop_reason),
            (runs.c.health, health),
            (runs.c.status, status),
        ):
            if value is not None:
                conditions.append(column == value)
        if since is not None:
            conditions.append(runs.c.created_at >= since)
        if until is not None:
            conditions.append(runs.c.created_at < until)
        query = sa.select(runs).where(*conditions)
        count = sa.select(sa.func.count()).select_from(runs).where(*conditions)
        with self.engine.connect() as conn:
            total = int(conn.execute(count).scalar_one())
            rows = conn.execute(
                query.order_by(runs.c.created_at.desc(), runs.c.trace_id)
                .limit(max(1, min(limit, MAX_PAGE)))
                .offset(max(0, min(offset, MAX_OFFSET)))
            ).all()
        return [_row_to_run(r._mapping) for r in rows], total

    def verdicts(self, trace_id: str) -> list[VerdictRow]:
        """A run's verdict history, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(verdicts).where(verdicts.c.trace_id == trace_id).order_by(verdicts.c.id)
            ).all()
        return [VerdictRow(**{k: v for k, v in r._mapping.items() if k != "id"}) for r in rows]

    def calls(self, trace_id: str) -> list[CallRow]:
        """A run's recorded calls (the last :data:`MAX_CALLS_PER_RUN`), in order."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(calls).where(calls.c.trace_id == trace_id).order_by(calls.c.call_index)
            ).all()
        return [CallRow(**dict(r._mapping)) for r in rows]

    def counts_by_verdict(self, since: float | None = None) -> dict[str, int]:
        """How many runs hold each verdict (of runs created since ``since``)."""
        query = sa.select(runs.c.verdict, sa.func.count()).group_by(runs.c.verdict)
        if since is not None:
            query = query.where(runs.c.created_at >= since)
        with self.engine.connect() as conn:
            return {v: int(n) for v, n in conn.execute(query).all()}

    # -- the alert outbox ---------------------------------------------------------------------

    def due_alerts(self, now: float, limit: int = 50) -> list[OutboxItem]:
        """Undelivered alerts whose next attempt is due, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(outbox)
                .where(
                    outbox.c.delivered_at.is_(None),
                    outbox.c.failed_at.is_(None),
                    outbox.c.next_at <= now,
                )
                .order_by(outbox.c.id)
                .limit(limit)
            ).all()
        return [
            OutboxItem(
                id=r.id,
                dedupe_key=r.dedupe_key,
                trace_id=r.trace_id,
                target=r.target,
                action=r.action,
                payload=json.loads(r.payload),
                attempts=r.attempts,
                next_at=r.next_at,
            )
            for r in rows
        ]

    def alert_done(self, item_id: int, now: float) -> None:
        """Mark an alert delivered."""
        with self._writing() as conn:
            conn.execute(
                outbox.update().where(outbox.c.id == item_id).values(delivered_at=now)
            )

    def alert_failed(
        self, item_id: int, attempts: int, next_at: float | None, error: str, now: float
    ) -> None:
        """Record a failed attempt: retry at ``next_at``, or give up (``next_at=None``)."""
        values: dict[str, Any] = {"attempts": attempts, "last_error": error[:500]}
        if next_at is None:
            values["failed_at"] = now
        else:
            values["next_at"] = next_at
        with self._writing() as conn:
            conn.execute(outbox.update().where(outbox.c.id == item_id).values(**values))

    def outbox(self) -> list[dict[str, Any]]:
        """Every outbox row (tests, operators)."""
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(sa.select(outbox).order_by(outbox.c.id))]

    # -- internals ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction, one at a time on SQLite (its single writer)."""
        lock = self._write_lock
        if lock is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with lock, self.engine.begin() as conn:
            yield conn

    def truncate(self) -> None:
        """Delete every row of every table (tests)."""
        with self._writing() as conn:
            for table in reversed(metadata.sorted_tables):
                conn.execute(table.delete())


_KEEP_ON_UPDATE: Final = frozenset({"created_at", "killed", "acknowledged", "resolved"})
"""Columns an upsert of a run never overwrites: set once, or by the operator."""


class _Upsert:
    """An upsert compiled once; on SQLite executed with the driver's ``executemany``.

    The runs and calls of every processing step go through here (hundreds of rows a request).
    On SQLite, SQLAlchemy's per-row work (a dict per row, then its parameters through the
    compiled statement) cost twice what the database did, so the rows go to ``sqlite3`` as
    tuples read straight off the row objects, in the compiled statement's parameter order
    (the tables' types need no bind processing there: text, numbers, booleans, ``None``). On
    PostgreSQL, SQLAlchemy's own batching of many rows into one ``INSERT`` (its
    "insertmanyvalues") beats the driver's ``executemany``, so the statement goes through it.
    """

    __slots__ = ("constants", "order", "sql", "stmt")

    def __init__(self, stmt: Any, table: sa.Table, dialect: Any) -> None:
        self.stmt = stmt
        self.sql: str | None = None
        self.order: tuple[str, ...] = ()
        self.constants: dict[str, Any] = {}
        if dialect.name == "sqlite":
            compiled = stmt.compile(dialect=dialect)
            columns = {c.name for c in table.columns}
            self.sql = str(compiled)
            self.order = tuple(compiled.positiontup or ())
            self.constants = {k: v for k, v in compiled.params.items() if k not in columns}

    def execute(self, conn: Connection, rows: Sequence[Any], values: Callable[[Any], dict[str, Any]]) -> None:
        """Upsert ``rows`` (row objects; ``values`` makes one's column dict)."""
        if self.sql is None:
            conn.execute(self.stmt, [values(r) for r in rows])
            return
        if self.constants:
            constants, order = self.constants, self.order
            params = [tuple([v[k] if k in v else constants[k] for k in order]) for v in map(values, rows)]
        else:
            params = list(map(attrgetter(*self.order), rows))
        conn.exec_driver_sql(self.sql, params)


def _as_dict(value: Any) -> dict[str, Any]:
    names = getattr(value, "__struct_fields__", None) or value.__slots__
    return {name: getattr(value, name) for name in names}


def _create_private(path: str | None) -> None:
    """Create a new SQLite file readable by its owner only (0600: it holds the fleet's runs,
    receipts and, with ``--store-raw``, tool arguments); SQLite gives its ``-wal`` and ``-shm``
    files the same mode. An existing file keeps the mode its owner gave it."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    with contextlib.suppress(OSError):  # it exists, or SQLite will say what is wrong
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
    finally:
        cursor.close()


def _redact(url: str) -> str:
    """The URL without its password."""
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: show its scheme only
        return url.split(":", 1)[0] + ":…"

