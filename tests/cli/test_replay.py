"""``tripwire replay``: JSON Lines, table, exit codes, bad input, options and env vars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tripwire.cli import app

T0 = 1_700_000_000_000_000_000
SECRET = "customer-4242@example.com"
"""An argument value that must never reach the output."""

runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


def _s(key: str, value: str) -> dict[str, Any]:
    return {"key": key, "value": {"stringValue": value}}


def _tool(trace: int, span: int, tool: str, args: str | None, at: int) -> dict[str, Any]:
    attrs = [_s("gen_ai.operation.name", "execute_tool"), _s("gen_ai.tool.name", tool)]
    if args is not None:
        attrs.append(_s("gen_ai.tool.call.arguments", args))
    return {
        "traceId": f"{trace:032x}", "spanId": f"{span:016x}", "parentSpanId": f"{1:016x}",
        "name": f"execute_tool {tool}", "startTimeUnixNano": str(T0 + at * 10**9),
        "endTimeUnixNano": str(T0 + at * 10**9 + 1), "attributes": attrs, "status": {},
    }


def _agent(trace: int, name: str) -> dict[str, Any]:
    return {
        "traceId": f"{trace:032x}", "spanId": f"{1:016x}", "name": f"invoke_agent {name}",
        "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + 10**12),
        "attributes": [_s("gen_ai.operation.name", "invoke_agent"), _s("gen_ai.agent.name", name)],
        "status": {},
    }


def _write(path: Path, *spans_groups: list[dict[str, Any]]) -> Path:
    body = {"resourceSpans": [{"scopeSpans": [{"spans": g}]} for g in spans_groups]}
    path.write_text(json.dumps(body))
    return path


def _looping(trace: int, n: int = 8) -> list[dict[str, Any]]:
    args = json.dumps({"email": SECRET})
    return [_agent(trace, "looper")] + [_tool(trace, 100 + i, "lookup", args, i + 1) for i in range(n)]


def _working(trace: int, n: int = 6) -> list[dict[str, Any]]:
    return [_agent(trace, "worker")] + [
        _tool(trace, 100 + i, "lookup", json.dumps({"id": i}), i + 1) for i in range(n)
    ]


PINNED = ["--window", "10", "--threshold", "4", "--max-period", "off"]


@pytest.fixture
def traces(tmp_path: Path) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    _write(d / "loop.json", _looping(1))
    _write(d / "work.json", _working(2))
    _write(d / "empty.json", [_agent(3, "idle")])
    return d


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_json_lines_one_object_per_trace(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), "--json", *PINNED])
    assert result.exit_code == 0, result.output
    by_id = {o["trace_id"]: o for o in _lines(result.stdout)}
    assert len(by_id) == 3
    loop = by_id[f"{1:032x}"]
    assert loop["agent"] == "looper"
    assert loop["tool_calls"] == 8
    assert loop["verdict"] == "stuck"
    assert loop["first_trip"]["call_index"] == 4
    assert loop["first_trip"]["tool"] == "lookup"
    assert loop["first_trip"]["rule"] == "repetition"
    assert loop["first_trip"]["period"] == 1
    assert loop["first_trip"]["hits"] == 4
    assert loop["calls_after_trip"] == 4
    assert loop["arguments_seen"] is True
    assert loop["policy_version"].startswith("p2:default:")
    assert loop["normalizer_version"]
    work = by_id[f"{2:032x}"]
    assert (work["verdict"], work["first_trip"], work["calls_after_trip"]) == ("working", None, 0)
    empty = by_id[f"{3:032x}"]
    assert (empty["tool_calls"], empty["verdict"], empty["agent"]) == (0, "working", "idle")
    assert SECRET not in result.output


def test_skip_empty(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), "--json", "--skip-empty", *PINNED])
    assert result.exit_code == 0, result.output
    assert {o["tool_calls"] for o in _lines(result.stdout)} == {8, 6}


def test_table(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), *PINNED], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"{1:032x}"[:12] in out
    assert "looper" in out and "stuck" in out
    assert "call 4 · repetition" in out
    assert "lookup" in out and "x4" in out
    assert "totals: 3 trace(s) · 14 tool call(s) · 1 stuck · 2 working" in out
    assert SECRET not in result.output


def test_fail_on_stuck(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), "--json", "--fail-on", "stuck", *PINNED])
    assert result.exit_code == 1, result.output
    assert "1 trace(s) ended with a --fail-on verdict (1 stuck)" in result.stderr
    assert len(_lines(result.stdout)) == 3
    ok = runner.invoke(app, ["replay", str(traces / "work.json"), "--fail-on", "stuck", *PINNED])
    assert ok.exit_code == 0, ok.output


def test_fail_on_from_env(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), "--json", *PINNED], env={"TRIPWIRE_FAIL_ON": "stuck"})
    assert result.exit_code == 1


def test_bad_input_named_rest_processed_exit_2(traces: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    good_line = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": _working(7, 2)}]}]})
    bad.write_text("\n".join([good_line, good_line, "{not json", good_line]))
    result = runner.invoke(app, ["replay", str(traces), str(bad), "--json", *PINNED])
    assert result.exit_code == 2, result.output
    assert f"{bad}:3:" in result.stderr
    assert "--keep-going" in result.stderr
    ids = {o["trace_id"] for o in _lines(result.stdout)}
    assert ids == {f"{n:032x}" for n in (1, 2, 3, 7)}

    kept = runner.invoke(app, ["replay", str(traces), str(bad), "--json", "--keep-going", *PINNED])
    assert kept.exit_code == 0, kept.output
    assert "warning:" in kept.stderr and f"{bad}:3:" in kept.stderr


def test_nothing_readable(tmp_path: Path) -> None:
    result = runner.invoke(app, ["replay", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert "no such file" in result.stderr


def test_no_arguments_uncertain_by_default_stuck_with_key_tool(tmp_path: Path) -> None:
    f = _write(tmp_path / "blind.json", [_tool(5, 100 + i, "fetch_page", None, i + 1) for i in range(6)])
    result = runner.invoke(app, ["replay", str(f), "--json", *PINNED])
    (obj,) = _lines(result.stdout)
    assert (obj["arguments_seen"], obj["verdict"], obj["first_trip"]) == (False, "uncertain", None)
    assert "argument capture" in obj["reason"]
    result = runner.invoke(app, ["replay", str(f), "--json", "--key", "tool", *PINNED])
    (obj,) = _lines(result.stdout)
    assert (obj["verdict"], obj["first_trip"]["call_index"], obj["calls_after_trip"]) == ("stuck", 4, 2)


def test_policy_file_and_override(traces: Path, tmp_path: Path) -> None:
    policy = tmp_path / "tripwire.toml"
    policy.write_text('version = 1\n[policy]\nwindow = 10\nthreshold = 6\nmax_period = "off"\n')
    result = runner.invoke(app, ["replay", str(traces / "loop.json"), "--json", "--policy", str(policy)])
    (obj,) = _lines(result.stdout)
    assert obj["first_trip"]["call_index"] == 6
    result = runner.invoke(
        app, ["replay", str(traces / "loop.json"), "--json", "--policy", str(policy), "--threshold", "3"]
    )
    (obj,) = _lines(result.stdout)
    assert obj["first_trip"]["call_index"] == 3


def test_bad_policy_file_is_a_usage_error(traces: Path, tmp_path: Path) -> None:
    policy = tmp_path / "tripwire.toml"
    policy.write_text("version = 1\n[policy]\nwindw = 10\n")
    result = runner.invoke(app, ["replay", str(traces), "--policy", str(policy)])
    assert result.exit_code == 2
    assert "policy.windw" in result.stderr


def test_env_var_options(traces: Path) -> None:
    result = runner.invoke(
        app, ["replay", str(traces / "loop.json"), "--json"],
        env={"TRIPWIRE_WINDOW": "10", "TRIPWIRE_THRESHOLD": "5", "TRIPWIRE_MAX_PERIOD": "off"},
    )
    assert result.exit_code == 0, result.output
    (obj,) = _lines(result.stdout)
    assert obj["first_trip"]["call_index"] == 5


def test_volatile_key_option(tmp_path: Path) -> None:
    spans = [_tool(6, 100 + i, "search", json.dumps({"q": "x", "cursor": i}), i + 1) for i in range(5)]
    f = _write(tmp_path / "a.json", spans)
    (obj,) = _lines(runner.invoke(app, ["replay", str(f), "--json", *PINNED]).stdout)
    assert obj["first_trip"] is None
    (obj,) = _lines(runner.invoke(app, ["replay", str(f), "--json", "--volatile-key", "cursor", *PINNED]).stdout)
    assert obj["first_trip"]["call_index"] == 4


@pytest.mark.parametrize(
    "args",
    [
        ["--max-period", "1"],
        ["--max-period", "soon"],
        ["--window", "2"],  # below the preset's threshold
        ["--policy-preset", "aggressive"],
        ["--key", "args"],
        ["--window", "0"],
    ],
)
def test_usage_errors_exit_2(traces: Path, args: list[str]) -> None:
    result = runner.invoke(app, ["replay", str(traces), *args])
    assert result.exit_code == 2, result.output


def test_stdin(traces: Path) -> None:
    result = runner.invoke(app, ["replay", "-", "--json", *PINNED], input=(traces / "loop.json").read_bytes())
    assert result.exit_code == 0, result.output
    (obj,) = _lines(result.stdout)
    assert obj["first_trip"]["call_index"] == 4


def test_help_names_env_vars_and_default_of_empty_traces() -> None:
    result = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "TRIPWIRE_WINDOW" in result.stdout
    assert "By default they are reported" in result.stdout
