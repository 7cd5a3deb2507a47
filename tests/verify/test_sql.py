"""SqlRowCheck against a real SQLite file and the real PostgreSQL test database."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy

from tripwire.core.receipt import VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify import SqlRowCheck

T0 = 1_700_000_000.0
QUERY = "SELECT status, total FROM invoices WHERE number = :number"


def clock() -> float:
    return T0


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    path = tmp_path / "app.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE invoices (number TEXT PRIMARY KEY, status TEXT, total REAL)")
        conn.execute("INSERT INTO invoices VALUES ('INV-0042', 'sent', 120.5)")
    return f"sqlite:///{path}"


def test_sqlite_row_with_expected_fields_passes(sqlite_url: str) -> None:
    receipt = SqlRowCheck(
        url=sqlite_url,
        query=QUERY,
        params={"number": "INV-0042"},
        expected={"status": "sent", "total": 120.5},
        clock=clock,
    )()
    assert receipt.passed is True, receipt.error
    assert receipt.kind is VerifierKind.SQL
    assert receipt.checked_at == T0
    assert receipt.observed == {"row": True, "status": "sent", "total": 120.5}
    assert receipt.expected == {"row": True, "status": "sent", "total": 120.5}
    assert "INV-0042" not in receipt.target  # params are not recorded


def test_sqlite_wrong_value_fails(sqlite_url: str) -> None:
    receipt = SqlRowCheck(
        url=sqlite_url,
        query=QUERY,
        params={"number": "INV-0042"},
        expected={"status": "paid"},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is None
    assert receipt.observed["status"] == "sent"


def test_sqlite_no_row_fails(sqlite_url: str) -> None:
    receipt = SqlRowCheck(url=sqlite_url, query=QUERY, params={"number": "INV-9999"}, clock=clock)()
    assert receipt.passed is False
    assert receipt.observed == {"row": False}


def test_missing_column_fails_and_is_named(sqlite_url: str) -> None:
    receipt = SqlRowCheck(
        url=sqlite_url,
        query=QUERY,
        params={"number": "INV-0042"},
        expected={"customer": "ACME"},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.observed["missing_columns"] == "customer"


def test_sql_error_becomes_a_failed_receipt(sqlite_url: str) -> None:
    receipt = SqlRowCheck(
        url=sqlite_url,
        query="SELECT * FROM no_such_table WHERE x = :x",
        params={"x": "customer-secret"},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is not None
    assert receipt.error.startswith("OperationalError")
    assert "customer-secret" not in receipt.error


def test_existing_engine(sqlite_url: str) -> None:
    engine = sqlalchemy.create_engine(sqlite_url)
    try:
        receipt = SqlRowCheck(
            engine=engine,
            query=QUERY,
            params={"number": "INV-0042"},
            expected={"status": "sent"},
            clock=clock,
        )()
    finally:
        engine.dispose()
    assert receipt.passed is True, receipt.error


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": QUERY}, "SqlRowCheck.url"),
        ({"query": QUERY, "url": "sqlite://", "engine": object()}, "SqlRowCheck.url"),
        ({"query": " ", "url": "sqlite://"}, "SqlRowCheck.query"),
        ({"query": QUERY, "url": "not a url"}, "SqlRowCheck.url"),
        ({"query": QUERY, "url": "sqlite://", "timeout_s": -1}, "SqlRowCheck.timeout_s"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        SqlRowCheck(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_unreachable_database_is_a_failed_receipt(closed_port: int) -> None:
    started = time.monotonic()
    receipt = SqlRowCheck(
        url=f"postgresql+psycopg://postgres:hunter2@127.0.0.1:{closed_port}/test",
        query="SELECT 1 AS one",
        timeout_s=5,
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is not None
    assert "hunter2" not in receipt.target + receipt.error
    assert time.monotonic() - started < 6


@pytest.mark.postgres
def test_postgres_row_passes_with_numeric_and_timestamp(postgres_url: str, pg_table: str) -> None:
    receipt = SqlRowCheck(
        url=postgres_url,
        query=f"SELECT status, total, sent_at FROM {pg_table} WHERE number = :number",
        params={"number": "INV-0042"},
        expected={"status": "sent", "total": 120.5, "sent_at": "2024-06-01T12:30:00"},
        clock=clock,
    )()
    assert receipt.passed is True, receipt.error
    assert receipt.observed == {
        "row": True,
        "status": "sent",
        "total": "120.50",
        "sent_at": "2024-06-01T12:30:00",
    }


@pytest.mark.postgres
def test_postgres_mismatch_fails(postgres_url: str, pg_table: str) -> None:
    receipt = SqlRowCheck(
        url=postgres_url,
        query=f"SELECT total FROM {pg_table} WHERE number = :number",
        params={"number": "INV-0042"},
        expected={"total": 99.99},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is None


@pytest.mark.postgres
def test_postgres_password_is_hidden_in_the_target(postgres_url: str, pg_table: str) -> None:
    url = sqlalchemy.engine.make_url(postgres_url).set(password="s3cret-pw")
    receipt = SqlRowCheck(
        url=url.render_as_string(hide_password=False),
        query=f"SELECT status FROM {pg_table}",
        clock=clock,
    )()
    assert receipt.passed is True, receipt.error
    assert "s3cret-pw" not in receipt.target
    assert "***" in receipt.target


@pytest.mark.postgres
def test_postgres_slow_query_times_out(postgres_url: str) -> None:
    started = time.monotonic()
    receipt = SqlRowCheck(
        url=postgres_url, query="SELECT pg_sleep(5) AS slept", timeout_s=0.5, clock=clock
    )()
    assert receipt.passed is False
    assert receipt.error is not None
    assert time.monotonic() - started < 3


# --- issue 16: errors are redacted like everything else ------------------------------------------

EMAIL = "alice.smith@example.com"


def test_a_postgres_driver_error_does_not_leak_the_bind_parameter(
    postgres_url: str, pg_table: str
) -> None:
    receipt = SqlRowCheck(
        url=postgres_url,
        query=f"SELECT status FROM {pg_table} WHERE number = :number AND CAST(:email AS integer) > 0",
        params={"number": "INV-0042", "email": EMAIL},
        expected={"status": "sent"},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is not None
    assert receipt.error.startswith("DataError: ") and "invalid input syntax" in receipt.error
    assert EMAIL not in json.dumps(receipt.to_dict())
    assert "alice" not in receipt.error


def test_a_sqlite_driver_error_does_not_leak_the_bind_parameter(sqlite_url: str) -> None:
    receipt = SqlRowCheck(
        url=sqlite_url,
        query="SELECT json_extract('{}', :path) AS x",
        params={"path": EMAIL},
        clock=clock,
    )()
    assert receipt.passed is False
    assert receipt.error is not None and "JSON path error" in receipt.error
    assert EMAIL not in json.dumps(receipt.to_dict())


def test_explain_shows_the_redacted_error_of_a_failed_check(
    postgres_url: str, pg_table: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from tripwire.cli import app
    from tripwire.core.reasons import StopReason
    from tripwire.core.receipt import EndKind, StopReceipt

    outcome = SqlRowCheck(
        url=postgres_url,
        query=f"SELECT status FROM {pg_table} WHERE CAST(:email AS integer) > 0",
        params={"email": EMAIL},
        clock=clock,
    )()
    path = tmp_path / "receipt.json"
    path.write_text(
        StopReceipt(
            run_id="run-1",
            agent="crm-bot",
            end=EndKind.NATURAL_FINISH,
            reason=StopReason.COMPLETED,
            outcomes=(outcome,),
        ).to_json()
    )
    for args in (["explain", str(path)], ["explain", str(path), "--json"]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "FALSE_COMPLETE" in result.stdout or "false_complete" in result.stdout
        assert "invalid input syntax" in " ".join(result.stdout.split())
        assert EMAIL not in result.stdout and "alice" not in result.stdout


def test_explain_says_why_a_check_failed_without_an_error(sqlite_url: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tripwire.cli import app
    from tripwire.core.reasons import StopReason
    from tripwire.core.receipt import EndKind, StopReceipt

    outcome = SqlRowCheck(
        url=sqlite_url,
        query=QUERY,
        params={"number": "INV-0042"},
        expected={"status": "paid"},
        clock=clock,
    )()
    assert outcome.error is None
    path = tmp_path / "receipt.json"
    path.write_text(
        StopReceipt(
            run_id="run-1",
            agent="billing-bot",
            end=EndKind.NATURAL_FINISH,
            reason=StopReason.COMPLETED,
            outcomes=(outcome,),
        ).to_json()
    )
    text = " ".join(CliRunner().invoke(app, ["explain", str(path)]).stdout.split())
    assert "reason: natural_finish, but the sql check of" in text
    assert text.count("status: expected 'paid', observed 'sent'") == 2  # the reason and the row
    data = json.loads(CliRunner().invoke(app, ["explain", str(path), "--json"]).stdout)
    assert data["reason"].endswith("failed: status: expected 'paid', observed 'sent'")
