"""``tripwire report`` on one seeded data set, loaded into SQLite and into the real PostgreSQL:
the numbers are the ones computed by hand below, and the same from both databases."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tripwire.report import build_report, percentile_cont, write_limits_file
from tripwire.store.runs import Batch, RunRow, RunStore, VerdictRow

PG_URL = os.environ.get("TRIPWIRE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
NOW = 1_800_000_000.0


def _seed(store: RunStore) -> None:
    rows: list[RunRow] = []
    verdicts: list[VerdictRow] = []
    # alpha: 20 healthy runs making 1..20 tool calls and 2..21 steps.
    for i in range(1, 21):
        rows.append(RunRow(trace_id=f"a{i:031x}", agent="alpha", status="ended", stop_reason="completed", health="complete_unverified",
                           steps=i + 1, tool_calls=i, duration_s=float(i), cost_usd=i / 100, created_at=NOW - 3600, updated_at=NOW))
    # alpha: two runs stuck on search_docs, 6 calls and $0.05 after the first stuck verdict each.
    for i in (1, 2):
        tid = f"b{i:031x}"
        rows.append(RunRow(trace_id=tid, agent="alpha", status="ended", verdict="stuck", rule="repetition", stop_reason="loop_detected",
                           health="stuck", steps=11, tool_calls=10, duration_s=10.0, cost_usd=0.1, first_stuck_call=4, calls_after_stuck=6,
                           cost_after_stuck=0.05, created_at=NOW - 3600, updated_at=NOW))
        verdicts.append(VerdictRow(trace_id=tid, at=NOW, verdict="stuck", rule="repetition", tool="search_docs", digest="3f9a0c1e2d4b", call_index=4, hits=4))
    # alpha: one run stopped by its 25-step cap (the cap it runs with today).
    rows.append(RunRow(trace_id="c" * 32, agent="alpha", status="ended", stop_reason="max_steps", health="bounded_stop", steps=25,
                       tool_calls=30, duration_s=30.0, cost_usd=0.3, created_at=NOW - 3600, updated_at=NOW,
                       receipt={"condition": {"steps": 25, "max_steps": 25}, "reason": "max_steps"}))
    # beta: four runs of 10, 20, 30, 40 calls; too few to learn from.
    for n, calls in enumerate((10, 20, 30, 40)):
        rows.append(RunRow(trace_id=f"d{n:031x}", agent="beta", status="ended", stop_reason="completed", health="verified_complete",
                           steps=calls, tool_calls=calls, duration_s=calls / 10, cost_usd=None, created_at=NOW - 7200, updated_at=NOW))
    # Outside the time range: an old run that must not count.
    rows.append(RunRow(trace_id="e" * 32, agent="beta", status="ended", stop_reason="max_tool_calls", health="bounded_stop",
                       steps=999, tool_calls=999, created_at=NOW - 30 * 86400, updated_at=NOW))
    store.write(Batch(runs=rows, verdicts=verdicts))


def _pg() -> RunStore:
    try:
        return RunStore.open(PG_URL)
    except sa.exc.OperationalError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"PostgreSQL at {PG_URL} is unreachable ({exc.orig}); CI=true requires it", pytrace=False)
        pytest.skip(f"SKIPPED, NEEDS A SERVICE: PostgreSQL at {PG_URL} ({exc.orig})")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunStore]:
    s = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}") if request.param == "sqlite" else _pg()
    s.truncate()
    _seed(s)
    yield s
    s.truncate()
    s.dispose()


def test_percentile_cont_is_linear_between_ranks() -> None:
    assert percentile_cont([10, 20, 30, 40], 0.5) == 25
    assert percentile_cont([10, 20, 30, 40], 0.95) == pytest.approx(38.5)  # 30 + 0.85 * 10
    assert percentile_cont([10, 20, 30, 40], 0.99) == pytest.approx(39.7)
    assert percentile_cont([7], 0.99) == 7
    assert percentile_cont([], 0.5) is None


def test_report_numbers_from_both_databases(store: RunStore) -> None:
    report = build_report(store, since=NOW - 7 * 86400)
    assert report.overall.runs == 27
    alpha, beta = report.agents
    assert (alpha.agent, alpha.runs, beta.agent, beta.runs) == ("alpha", 23, "beta", 4)
    # beta's tool calls 10, 20, 30, 40: p50 25, p95 38.5, p99 39.7; its cost is unknown.
    assert beta.percentiles["tool_calls"] == pytest.approx({"p50": 25.0, "p95": 38.5, "p99": 39.7})
    assert beta.percentiles["duration_s"] == pytest.approx({"p50": 2.5, "p95": 3.85, "p99": 3.97})
    assert beta.percentiles["cost_usd"] == {"p50": None, "p95": None, "p99": None}
    # alpha's tool calls sorted: 1..9, 10, 10, 10, 11..20, 30 (23 values, positions 0..22).
    # p50: position 11, a 10.
    assert alpha.percentiles["tool_calls"]["p50"] == pytest.approx(10.0)
    # p95: position 0.95 * 22 = 20.9, between 19 (position 20) and 20 (position 21): 19.9.
    assert alpha.percentiles["tool_calls"]["p95"] == pytest.approx(19.9)
    # p99: position 21.78 between 20 (22nd) and 30 (23rd): 20 + 0.78 * 10.
    assert alpha.percentiles["tool_calls"]["p99"] == pytest.approx(27.8)
    assert alpha.stop_reasons == {"completed": 20, "loop_detected": 2, "max_steps": 1}
    assert alpha.rate("max_steps") == pytest.approx(1 / 23)
    assert alpha.health == {"complete_unverified": 20, "stuck": 2, "bounded_stop": 1}
    assert alpha.looping_tools == [("search_docs", 2)]
    assert alpha.looping_signatures == [("search_docs", "3f9a0c1e2d4b", 2)]
    assert (alpha.stuck_runs, alpha.calls_after_stuck) == (2, 12)
    assert alpha.cost_after_stuck == pytest.approx(0.10)
    # Learned lines at alpha = 0.05 from the 20 healthy runs: rank ceil(21 * 0.95) = 20.
    tool_line, step_line = alpha.learned
    assert (tool_line.counter, tool_line.line, tool_line.healthy_runs) == ("tool_calls", 20, 20)
    assert (step_line.counter, step_line.line, step_line.current) == ("steps", 21, 25.0)
    assert "tighter" in step_line.note
    assert [line.line for line in beta.learned] == [None, None]
    assert "at least 19 healthy runs" in beta.learned[0].note


def test_sqlite_and_postgresql_agree_to_the_digit(tmp_path: Path) -> None:
    lite = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    pg = _pg()
    pg.truncate()
    try:
        _seed(lite)
        _seed(pg)
        a = build_report(lite, since=NOW - 7 * 86400).as_json()
        b = build_report(pg, since=NOW - 7 * 86400).as_json()
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    finally:
        pg.truncate()
        pg.dispose()


def test_write_limits_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    path = tmp_path / "tripwire.toml"
    path.write_text('# my agent\n[policy]\nwindow = 12\n\n[limits]\nmax_steps = 40 # old\nmax_cost_usd = 2.5\n\n[digest]\nkey_file = "k"\n')
    write_limits_file(path, {"max_steps": 21, "max_tool_calls": 20})
    import tomllib

    data = tomllib.loads(path.read_text())
    assert data["limits"] == {"max_steps": 21, "max_cost_usd": 2.5, "max_tool_calls": 20}
    assert data["policy"] == {"window": 12} and data["digest"] == {"key_file": "k"}
    assert path.read_text().startswith("# my agent\n")
    fresh = tmp_path / "new.toml"
    write_limits_file(fresh, {"max_tool_calls": 7})
    assert tomllib.loads(fresh.read_text()) == {"version": 1, "limits": {"max_tool_calls": 7}}
    bad = tmp_path / "bad.toml"
    bad.write_text("[limits\n")
    with pytest.raises(ValueError):
        write_limits_file(bad, {"max_tool_calls": 7})
    assert bad.read_text() == "[limits\n"


def test_written_limits_load_through_the_one_loader(tmp_path: Path) -> None:
    from tripwire.config import load_config

    # A new file: what write_limits_file creates, load_config reads, with the same limits.
    fresh = tmp_path / "fresh.toml"
    write_limits_file(fresh, {"max_tool_calls": 37, "max_steps": 12})
    limits = load_config({"config": fresh}, env={}).limits
    assert limits is not None and (limits.max_tool_calls, limits.max_steps) == (37, 12)

    # An existing file without a version: edited in place, the rest kept, loadable after.
    edited = tmp_path / "tripwire.toml"
    edited.write_text("# team settings\n\n[policy]\nwindow = 12\n\n[limits]\nmax_cost_usd = 2.5\n")
    write_limits_file(edited, {"max_tool_calls": 20})
    config = load_config({"config": edited}, env={})
    assert config.policy.window == 12
    assert config.limits is not None
    assert (config.limits.max_tool_calls, config.limits.max_cost_usd) == (20, 2.5)
    assert edited.read_text().startswith("# team settings\n")

    # Edited again: the version is not added twice and the new value replaces the old.
    write_limits_file(edited, {"max_tool_calls": 25})
    assert edited.read_text().count("version") == 1
    config = load_config({"config": edited}, env={})
    assert config.limits is not None and config.limits.max_tool_calls == 25


def test_write_limits_refuses_what_the_loader_would_refuse(tmp_path: Path) -> None:
    other = tmp_path / "v9.toml"
    other.write_text("version = 9\n")
    with pytest.raises(ValueError, match="version"):
        write_limits_file(other, {"max_tool_calls": 7})
    assert other.read_text() == "version = 9\n"
    typo = tmp_path / "typo.toml"
    typo.write_text("version = 1\n[limits]\nmax_tool_cals = 3\n")
    with pytest.raises(ValueError, match="max_tool_cals"):
        write_limits_file(typo, {"max_tool_calls": 7})
    assert "max_tool_calls" not in typo.read_text()
