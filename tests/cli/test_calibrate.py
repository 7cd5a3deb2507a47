"""``tripwire calibrate``: labels in both formats, the grid, front, recommendation, exit codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tripwire.cli import app

T0 = 1_700_000_000_000_000_000
runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _tool(trace: int, span: int, args: dict[str, Any], at: int) -> dict[str, Any]:
    attrs = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
        {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": json.dumps(args)}},
    ]
    return {
        "traceId": f"{trace:032x}", "spanId": f"{span:016x}", "name": "execute_tool lookup",
        "startTimeUnixNano": str(T0 + at * 10**9), "endTimeUnixNano": str(T0 + at * 10**9 + 1),
        "attributes": attrs,
    }


def _write(path: Path, trace: int, loop: bool, n: int = 8) -> None:
    spans = [_tool(trace, 10 + i, {"q": "same"} if loop else {"q": i}, i + 1) for i in range(n)]
    path.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    (d / "src").mkdir(parents=True)
    _write(d / "src" / "inc1.json", 1, loop=True)
    _write(d / "src" / "inc2.json", 2, loop=True)
    _write(d / "src" / "ok1.json", 3, loop=False)
    _write(d / "src" / "ok2.json", 4, loop=False)
    _write(d / "src" / "other.json", 5, loop=True)
    labels = [
        {"file": "src/inc1.json", "source": "src", "label": "runaway", "tool_calls": 8},
        {"file": "src/ok1.json", "label": "healthy"},
        {"file": "src/other.json", "label": "other"},
        {"trace_id": f"{2:032x}", "incident": True, "incident_from": 2},
        {"trace_id": f"{4:032x}", "incident": False},
    ]
    (d / "labels.jsonl").write_text("\n".join(json.dumps(x) for x in labels) + "\n")
    return d


GRID = ["--windows", "10", "--keys", "tool+args", "--max-periods", "off"]


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_one_policy_scored_by_hand(corpus: Path) -> None:
    result = runner.invoke(
        app,
        ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json",
         "--thresholds", "4", *GRID],
    )
    assert result.exit_code == 0, result.output
    (row,) = _lines(result.stdout)
    assert (row["window"], row["threshold"], row["key"], row["max_period"]) == (10, 4, "tool+args", None)
    assert (row["incidents"], row["caught"], row["healthy"], row["false_alarms"]) == (2, 2, 2, 0)
    assert row["catch_rate"] == 1.0 and row["false_alarm_rate"] == 0.0
    # Both incidents trip at call 4; one began at call 1, the other at call 2: delays 3 and 2.
    assert row["median_delay"] == 2.5
    assert row["median_flag_position"] == 0.5  # 4 of 8
    assert row["saved_share"] == 0.5  # 4 + 4 of 16 calls came after the flag
    assert row["cut_share"] == 0.0
    assert row["pareto"] is True and row["recommended"] is True
    assert "1 label(s) with other values ignored" in result.stderr


def test_front_and_recommendation(corpus: Path) -> None:
    result = runner.invoke(
        app,
        ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json",
         "--thresholds", "6,4", *GRID],
    )
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert [r["threshold"] for r in rows] == [4, 6]
    # Same catches and false alarms; threshold 6 flags two calls later (delays 5 and 4).
    assert rows[1]["median_delay"] == 4.5 and rows[1]["saved_share"] == 0.25
    assert [(r["pareto"], r["recommended"]) for r in rows] == [(True, True), (False, False)]


def test_table(corpus: Path) -> None:
    result = runner.invoke(
        app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--thresholds", "4,6", *GRID]
    )
    assert result.exit_code == 0, result.output
    assert "→★" in result.stdout
    assert "recommended: --key tool+args --window 10 --threshold 4 --max-period off" in result.stdout


def test_no_policy_under_the_cap_exits_1(corpus: Path) -> None:
    args = ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json",
            "--thresholds", "4", "--healthy-label", "healthy", "--healthy-label", "other", *GRID]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    (row,) = _lines(result.stdout)
    assert (row["healthy"], row["false_alarms"], row["recommended"]) == (3, 1, False)
    assert "--max-false-alarms" in result.stderr
    ok = runner.invoke(app, [*args, "--max-false-alarms", "0.5"])
    assert ok.exit_code == 0, ok.output


def test_configurable_incident_label(corpus: Path) -> None:
    result = runner.invoke(
        app,
        ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json",
         "--thresholds", "4", "--incident-label", "runaway", "--incident-label", "other", *GRID],
    )
    (row,) = _lines(result.stdout)
    assert row["incidents"] == 3 and row["caught"] == 3


def test_default_grid_contains_the_base_policy(corpus: Path) -> None:
    from tripwire.core.policy import LoopPolicy

    base = LoopPolicy()
    result = runner.invoke(app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    rows = _lines(result.stdout)
    assert any(r["policy_version"] == base.version for r in rows)
    assert sum(r["recommended"] for r in rows) == 1
    assert all(r["threshold"] <= r["window"] for r in rows)


def test_no_incidents_is_a_usage_error(corpus: Path, tmp_path: Path) -> None:
    labels = tmp_path / "l.jsonl"
    labels.write_text(json.dumps({"trace_id": f"{3:032x}", "incident": False}) + "\n")
    result = runner.invoke(app, ["calibrate", str(corpus), "--labels", str(labels), *GRID])
    assert result.exit_code == 2
    assert "no labelled incident" in result.stderr


def test_bad_label_line_named(corpus: Path) -> None:
    labels = corpus / "labels.jsonl"
    labels.write_text(labels.read_text() + "{oops\n")
    result = runner.invoke(app, ["calibrate", str(corpus), "--labels", str(labels), "--thresholds", "4", *GRID])
    assert result.exit_code == 2
    assert f"{labels}:6:" in result.stderr
    kept = runner.invoke(
        app, ["calibrate", str(corpus), "--labels", str(labels), "--thresholds", "4", "--keep-going", *GRID]
    )
    assert kept.exit_code == 0, kept.output


def test_missing_labels_file(corpus: Path) -> None:
    result = runner.invoke(app, ["calibrate", str(corpus), "--labels", str(corpus / "nope.jsonl")])
    assert result.exit_code == 2
    assert "cannot read the labels file" in result.stderr


@pytest.mark.parametrize(
    "args",
    [["--windows", "ten"], ["--thresholds", "1"], ["--keys", "args"], ["--max-periods", "1"],
     ["--windows", "3", "--thresholds", "4"],
     # Out of the policy's range: these were a ConfigError traceback with exit code 1.
     ["--windows", "300000000"], ["--max-periods", "999999999999999999999"]],
)
def test_grid_usage_errors(corpus: Path, args: list[str]) -> None:
    result = runner.invoke(app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), *args])
    assert result.exit_code == 2, result.output


def test_plot(corpus: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "cal.png"
    result = runner.invoke(
        app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--plot", str(out), *GRID]
    )
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = runner.invoke(
        app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--plot", str(tmp_path / "x.png"), *GRID]
    )
    assert result.exit_code == 2
    assert "pip install 'tripwire[plot]'" in result.stderr


@pytest.mark.parametrize("name", ["out.txt", "noext"])
def test_a_plot_name_that_cannot_be_written_is_refused_before_the_grid(
    corpus: Path, tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tripwire.replay.calibrate as grid

    def must_not_run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the grid ran before --plot was checked")

    monkeypatch.setattr(grid, "calibrate", must_not_run)
    out = tmp_path / name
    result = runner.invoke(
        app, ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--plot", str(out), *GRID]
    )
    assert result.exit_code == 2, result.output
    assert ".png" in result.stderr and "written" not in result.stderr
    assert not out.exists() and not (tmp_path / f"{name}.png").exists()


def test_help_shows_the_plot_extra_with_its_brackets() -> None:
    result = runner.invoke(app, ["calibrate", "--help"])
    assert result.exit_code == 0
    assert "pip install 'tripwire[plot]'" in " ".join(result.stdout.split())


def test_no_trace_in_the_input_has_its_own_exit_code(corpus: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["calibrate", str(empty), "--labels", str(corpus / "labels.jsonl")])
    assert result.exit_code == 3, result.output
    assert "no traces in the input" in result.stderr


def test_a_threshold_that_breaks_the_4th_call_promise_is_marked_not_recommended(corpus: Path) -> None:
    args = ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--thresholds", "3,4", *GRID]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["threshold"]: r for r in _lines(result.stdout)}
    # Both catch both incidents with no false alarm; 3 flags sooner, but stops the 3rd call.
    assert rows[3]["caught"] == rows[4]["caught"] == 2 and rows[3]["median_delay"] < rows[4]["median_delay"]
    assert (rows[3]["ships"], rows[3]["recommended"]) == (False, False)
    assert rows[3]["caveat"] == "threshold 3 stops an identical call before the 4th"
    assert (rows[4]["ships"], rows[4]["caveat"], rows[4]["recommended"]) == (True, "", True)
    table = runner.invoke(app, args)
    assert "recommended: --key tool+args --window 10 --threshold 4 --max-period off" in table.stdout
    assert "✗" in table.stdout and "not recommended without --any-setting" in table.stdout
    asked = runner.invoke(app, [*args, "--any-setting"])
    assert asked.exit_code == 0, asked.output
    assert "recommended: --key tool+args --window 10 --threshold 3 --max-period off" in asked.stdout
    assert "✗ threshold 3 stops an identical call before the 4th" in asked.stdout


def test_only_settings_that_break_a_promise_under_the_cap_exits_1_and_says_so(corpus: Path) -> None:
    # Counting "other" runs as healthy, threshold 4 flags one; only threshold 9 (which lets the
    # 4th identical call run) stays under a cap of 0.
    args = ["calibrate", str(corpus), "--labels", str(corpus / "labels.jsonl"), "--json",
            "--thresholds", "4,9", "--healthy-label", "healthy", "--healthy-label", "other",
            "--max-false-alarms", "0", *GRID]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    rows = {r["threshold"]: r for r in _lines(result.stdout)}
    assert rows[9]["false_alarms"] == 0 and rows[9]["ships"] is False and not rows[9]["recommended"]
    assert "--any-setting" in result.stderr and "threshold 9 lets the 4th identical call run" in result.stderr
    asked = runner.invoke(app, [*args, "--any-setting"])
    assert asked.exit_code == 0, asked.output
