"""``tripwire report`` from the command line, on a seeded SQLite store."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from tripwire.cli import app
from tripwire.store.runs import Batch, RunRow, RunStore

runner = CliRunner()


def _store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore.open(url)
    now = time.time()
    rows = [
        RunRow(trace_id=f"{i:032x}", agent="support", status="ended", stop_reason="completed", health="complete_unverified",
               steps=i, tool_calls=i, duration_s=float(i), cost_usd=0.01 * i, created_at=now - 60, updated_at=now)
        for i in range(1, 25)
    ]
    store.write(Batch(runs=rows))
    store.dispose()
    return url


def test_json_report(tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", "--store", _store(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["overall"]["runs"] == 24
    (support,) = data["agents"]
    assert support["percentiles"]["tool_calls"]["p50"] == 12.5
    # 24 healthy runs of 1..24 calls at alpha 0.05: rank ceil(25 * 0.95) = 24, the line is 24.
    assert support["learned"][0] == {**support["learned"][0], "counter": "tool_calls", "line": 24}


def test_html_report_is_self_contained(tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = runner.invoke(app, ["report", "--store", _store(tmp_path), "--html", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "support" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_write_limits_writes_the_learned_lines(tmp_path: Path) -> None:
    limits = tmp_path / "tripwire.toml"
    result = runner.invoke(app, ["report", "--store", _store(tmp_path), "--agent", "support", "--write-limits", str(limits)])
    assert result.exit_code == 0, result.output
    import tomllib

    assert tomllib.loads(limits.read_text()) == {"version": 1, "limits": {"max_tool_calls": 24, "max_steps": 24}}
    from tripwire.config import load_config

    loaded = load_config({"config": limits}, env={}).limits
    assert loaded is not None and (loaded.max_tool_calls, loaded.max_steps) == (24, 24)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    url = _store(tmp_path)
    for args in (
        ["report", "--store", url, "--since", "yesterday"],
        ["report", "--store", url, "--alpha", "1.5"],
        ["report", "--store", url, "--html", str(tmp_path / "r.png")],
        ["report", "--store", url, "--write-limits", str(tmp_path / "x.toml")],
        ["report", "--store", "mysql://u:p@h/db"],
        # Each of these was a traceback: a ValueError from float("²"), a rich MarkupError from
        # the brackets in the message, a FileNotFoundError from writing the page.
        ["report", "--store", url, "--since", "²d"],
        ["report", "--store", url, "--since", "[/x]d"],
        ["report", "--store", url, "--html", str(tmp_path / "no-such-folder" / "r.html")],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), args
    shown = runner.invoke(app, ["report", "--store", url, "--since", "[/x]d"])
    assert "'[/x]d'" in shown.stderr  # the value as given, brackets and all


def test_the_suggested_command_is_quoted_for_the_shell_and_names_show_as_sent(tmp_path: Path) -> None:
    import shlex

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore.open(url)
    now = time.time()
    hostile = "x; rm -rf ~ [bold]"  # an agent name is whatever the agents reported
    store.write(Batch(runs=[
        RunRow(trace_id=f"{i:032x}", agent=hostile, status="ended", stop_reason="completed", health="complete_unverified",
               steps=i, tool_calls=i, created_at=now - 60, updated_at=now)
        for i in range(1, 25)
    ]))
    store.dispose()
    result = runner.invoke(app, ["report", "--store", url], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    # It was "tripwire report --agent x; rm -rf ~ --write-limits ..." (and "[bold]" was eaten).
    suggested = next(line for line in result.stdout.splitlines() if "--write-limits" in line)
    command = suggested[suggested.index("tripwire report"):suggested.index("tripwire.toml") + len("tripwire.toml")]
    assert shlex.split(command) == ["tripwire", "report", "--agent", hostile, "--write-limits", "tripwire.toml"]
    assert hostile in result.stdout
    limits = tmp_path / "tripwire.toml"
    result = runner.invoke(app, ["report", "--store", url, "--agent", hostile, "--write-limits", str(limits)])
    assert result.exit_code == 0, result.output
    assert "into [limits] of" in result.stderr


def test_runs_no_span_named_an_agent_for_are_one_label_apart_from_the_overall_row(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = RunStore.open(url)
    now = time.time()
    store.write(Batch(runs=[
        RunRow(trace_id=f"{i:032x}", agent=None if i % 2 else "support", status="ended", stop_reason="completed",
               health="complete_unverified", steps=i, tool_calls=i, created_at=now - 60, updated_at=now)
        for i in range(1, 9)
    ]))
    store.dispose()
    result = runner.invoke(app, ["report", "--store", url], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    # The unnamed runs were listed as "(all)" (like the overall row) in one table and "(none)" in another.
    first = [line for line in result.stdout.splitlines() if "(all)" in line]
    assert len(first) == 2  # the overall row of the two per-agent tables, nothing else
    assert "(none)" not in result.stdout
    assert sum("(no agent)" in line for line in result.stdout.splitlines()) >= 2
    out = tmp_path / "r.html"
    result = runner.invoke(app, ["report", "--store", url, "--html", str(out)])
    assert result.exit_code == 0, result.output
    # --html prints only where it wrote, not every table as well.
    assert result.stdout == "" and f"wrote {out}" in result.stderr
    page = out.read_text()
    assert page.count("all agents") == 1 and "(no agent)" in page
