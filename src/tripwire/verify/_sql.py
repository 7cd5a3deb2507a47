"""Database-row verifier: a SQL query whose first row must carry the intended field values."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from tripwire.core.receipt import OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify._common import (
    DEFAULT_TIMEOUT_S,
    Clock,
    Deadline,
    Finding,
    check_timeout,
    require,
    run_check,
    to_scalar,
)

__all__ = ["SqlRowCheck"]


def _same(observed: Any, expected: Scalar) -> bool:
    """Equality that tolerates what drivers return: Decimal vs number, dates vs ISO text."""
    if expected is None:
        return observed is None
    if isinstance(expected, bool):  # SQLite and some drivers return 0/1 for booleans
        return bool(observed == expected)
    if observed == expected:
        return True
    if isinstance(observed, Decimal) and isinstance(expected, (int, float)):
        return math.isfinite(expected) and observed == Decimal(str(expected))
    if isinstance(expected, str):
        return to_scalar(observed) == expected
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class SqlRowCheck:
    """Check a database row through SQLAlchemy: the query must return a row with ``expected``.

    The first row returned is compared field by field; extra columns are ignored and a
    query that returns no row fails. Bind values go in ``params`` (``:name`` placeholders),
    never formatted into the SQL. Example::

        SqlRowCheck(
            url="postgresql+psycopg://app@db/prod",
            query="SELECT status, total FROM invoices WHERE number = :number",
            params={"number": "INV-0042"},
            expected={"status": "sent", "total": 120.5},
        )()

    The receipt's target shows the URL without its password, and the SQL, not the params.
    On PostgreSQL the query runs under ``SET LOCAL statement_timeout``; on every database the
    check is abandoned after ``timeout_s``.
    """

    query: str
    """The SQL (a single SELECT), with ``:name`` bind placeholders."""
    url: str | None = None
    """A SQLAlchemy URL; the check makes (and disposes) its own engine. Give this or ``engine``."""
    engine: Any = field(default=None, hash=False, compare=False)
    """An existing ``sqlalchemy.engine.Engine`` to use instead of ``url``."""
    params: Mapping[str, Scalar] = field(default_factory=dict, hash=False)
    """Bind values for the query (not recorded in the receipt)."""
    expected: Mapping[str, Scalar] = field(default_factory=dict, hash=False)
    """Column name -> required value in the first row (empty: a row must exist)."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time budget of the whole check (connect + query), in seconds."""
    clock: Clock = time.time
    """Where ``checked_at`` comes from."""

    def __post_init__(self) -> None:
        sqlalchemy = require("sqlalchemy")
        if not isinstance(self.query, str) or not self.query.strip():
            raise ConfigError("SqlRowCheck.query", self.query, "a non-empty SQL string")
        if (self.url is None) == (self.engine is None):
            raise ConfigError("SqlRowCheck.url", "<url/engine>", "exactly one of url or engine")
        if self.url is not None:
            try:
                sqlalchemy.engine.make_url(self.url)
            except Exception:  # ArgumentError; the URL may hold a password, so not echoed
                raise ConfigError(
                    "SqlRowCheck.url", "<unparsable>", "a SQLAlchemy URL like 'sqlite:///f.db'"
                ) from None
        elif not isinstance(self.engine, sqlalchemy.engine.Engine):
            raise ConfigError(
                "SqlRowCheck.engine", type(self.engine).__name__, "a sqlalchemy Engine"
            )
        for name in ("params", "expected"):
            value = getattr(self, name)
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise ConfigError(
                    f"SqlRowCheck.{name}", type(value).__name__, "a str-keyed mapping"
                )
        check_timeout("SqlRowCheck", self.timeout_s)

    def _target(self) -> str:
        sqlalchemy = require("sqlalchemy")
        url = sqlalchemy.engine.make_url(self.url) if self.url is not None else self.engine.url
        shown = url.render_as_string(hide_password=True)
        sql = re.sub(r"\s+", " ", self.query).strip()
        if len(sql) > 300:
            sql = sql[:299] + "…"
        return f"{shown} :: {sql}"

    def __call__(self) -> OutcomeReceipt:
        """Run the query now; never raises (see :class:`~tripwire.verify.Verifier`)."""
        return run_check(
            kind=VerifierKind.SQL,
            target=self._target(),
            checked_by="tripwire.verify.sql",
            expected={"row": True, **self.expected},
            timeout_s=self.timeout_s,
            clock=self.clock,
            body=self._check,
            secrets=self.params.values(),
        )

    def _check(self, deadline: Deadline) -> Finding:
        sqlalchemy = require("sqlalchemy")
        engine = self.engine
        own = engine is None
        if own:
            url = sqlalchemy.engine.make_url(self.url)
            engine = sqlalchemy.create_engine(
                url,
                poolclass=sqlalchemy.pool.NullPool,
                hide_parameters=True,
                connect_args=_connect_args(url.get_driver_name(), self.timeout_s),
            )
        try:
            with engine.connect() as conn, conn.begin():
                if engine.dialect.name == "postgresql":
                    ms = max(1, int(deadline.remaining() * 1000))
                    conn.exec_driver_sql(f"SET LOCAL statement_timeout = {ms}")
                result = conn.execute(sqlalchemy.text(self.query), dict(self.params))
                row = result.mappings().first()
        finally:
            if own:
                engine.dispose()
        if row is None:
            return Finding(False, {"row": False})
        observed: dict[str, Scalar] = {"row": True}
        passed = True
        missing = []
        for key, want in self.expected.items():
            if key not in row:
                missing.append(key)
                passed = False
                continue
            observed[key] = to_scalar(row[key])
            passed = passed and _same(row[key], want)
        if missing:
            observed["missing_columns"] = ",".join(missing)
        return Finding(passed, observed)


def _connect_args(driver: str, timeout_s: float) -> dict[str, Any]:
    """Driver-level timeouts, for the drivers whose keyword is known."""
    if driver in ("pysqlite", "pysqlcipher"):
        return {"timeout": timeout_s}  # how long to wait for a locked database
    if driver in ("psycopg", "psycopg2", "psycopg2cffi"):
        return {"connect_timeout": max(1, math.ceil(timeout_s))}
    return {}
