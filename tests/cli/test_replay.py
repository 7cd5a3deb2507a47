"""``tripwire replay``: JSON Lines, table, exit codes, bad input, options and env vars."""

from __future__ import annotations

import json
import sys
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
    assert loop["policy_version"].startswith("p4:default:")
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
        ["--workers", "-1"],
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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork-based workers are Linux-only")
def test_workers_change_nothing_in_the_output(tmp_path: Path) -> None:
    d = tmp_path / "many"
    d.mkdir()
    for f in range(3):  # every trace is spread over the three files
        _write(d / f"part-{f}.json", *[
            (_looping(t, 9) if t % 3 == 0 else _working(t, 7))[f * 3:(f + 1) * 3] for t in range(1, 31)
        ])
    outputs = {}
    for workers in ("1", "3"):
        json_out = runner.invoke(app, ["replay", str(d), "--json", "--workers", workers, *PINNED])
        table = runner.invoke(app, ["replay", str(d), *PINNED], env={"TRIPWIRE_WORKERS": workers})
        assert json_out.exit_code == table.exit_code == 0, json_out.output + table.output
        outputs[workers] = (json_out.stdout, table.stdout)
    assert outputs["1"] == outputs["3"]
    lines = _lines(outputs["3"][0])
    assert [o["trace_id"] for o in lines] == [f"{t:032x}" for t in range(1, 31)]
    assert sum(o["verdict"] == "stuck" for o in lines) == 10
    # Standard input is read once, by this process: --workers does not apply.
    piped = runner.invoke(
        app, ["replay", "-", "--json", "--workers", "3", *PINNED], input=(d / "part-0.json").read_bytes()
    )
    assert piped.exit_code == 0, piped.output
    assert len(_lines(piped.stdout)) == 30


def test_help_names_env_vars_and_default_of_empty_traces() -> None:
    result = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())  # help is wrapped to the terminal
    assert "TRIPWIRE_WINDOW" in text
    assert "By default they are reported" in text
    assert "--workers" in text and "TRIPWIRE_WORKERS" in text and "16 MiB" in text


# -- configuration: one loader for options, variables and files -----------------------------


def test_a_huge_window_variable_is_refused_at_start_and_named(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces)], env={"TRIPWIRE_WINDOW": "1" + "0" * 22})
    assert result.exit_code == 2, result.output
    assert "TRIPWIRE_WINDOW" in result.stderr and "Traceback" not in result.output


def test_option_wins_over_variable_over_config_file(traces: Path, tmp_path: Path) -> None:
    config = tmp_path / "tripwire.toml"
    config.write_text("version = 1\n[policy]\nthreshold = 6\nwindow = 10\nmax_period = 'off'\n")
    by_file = runner.invoke(app, ["replay", str(traces / "loop.json"), "--json", "--config", str(config)])
    assert by_file.exit_code == 0, by_file.output
    assert _lines(by_file.stdout)[0]["first_trip"]["call_index"] == 6
    by_env = runner.invoke(
        app, ["replay", str(traces / "loop.json"), "--json"],
        env={"TRIPWIRE_CONFIG": str(config), "TRIPWIRE_THRESHOLD": "5"},
    )
    assert _lines(by_env.stdout)[0]["first_trip"]["call_index"] == 5
    by_option = runner.invoke(
        app, ["replay", str(traces / "loop.json"), "--json", "--threshold", "4"],
        env={"TRIPWIRE_CONFIG": str(config), "TRIPWIRE_THRESHOLD": "5"},
    )
    assert _lines(by_option.stdout)[0]["first_trip"]["call_index"] == 4


def test_a_policy_file_that_is_not_utf8_exits_2_without_a_traceback(traces: Path, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_bytes(b"version = 1\n# \xe9\xe9\n")
    result = runner.invoke(app, ["replay", str(traces), "--policy", str(policy)])
    assert result.exit_code == 2, result.output
    assert "not UTF-8" in result.stderr and "Traceback" not in result.output


# -- hostile input and what a new user trips on (issue 16) ------------------------------------


def test_an_empty_directory_is_not_a_green_gate(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["replay", str(empty), "--fail-on", "stuck"])
    assert result.exit_code == 3, result.output
    assert "no traces in the input" in result.stderr


def test_bad_files_exit_2_and_every_valid_result_is_kept(traces: Path) -> None:
    deep = '{"arrayValue": {"values": [' * 400 + '{"intValue": "1"}' + "]}}" * 400
    span = _tool(9, 900, "lookup", "{}", 1)
    span["startTimeUnixNano"] = "9" * 401
    text = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]})
    (traces / "bigtime.json").write_text(text)
    (traces / "deep.json").write_text(text.replace('"attributes": [', '"attributes": [{"key": "d", "value": ' + deep + "}, ", 1))
    (traces / "zero.json").symlink_to("/dev/zero")
    result = runner.invoke(app, ["replay", str(traces), "--json", *PINNED])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    ids = {o["trace_id"] for o in _lines(result.stdout)}
    assert {f"{1:032x}", f"{2:032x}", f"{3:032x}", f"{9:032x}"} <= ids
    for name in ("bigtime.json", "deep.json", "zero.json"):
        assert name in result.stderr
    kept = runner.invoke(app, ["replay", str(traces), "--json", "--keep-going", "--fail-on", "stuck", *PINNED])
    assert kept.exit_code == 1, kept.output  # the gate, distinct from bad input's 2


def test_a_gzip_bomb_is_a_bad_file_and_the_cap_can_be_raised(traces: Path) -> None:
    import gzip

    (traces / "bomb.json.gz").write_bytes(gzip.compress(b" " * (3 << 20)))
    result = runner.invoke(app, ["replay", str(traces), "--json", "--max-file-size", "1M", *PINNED])
    assert result.exit_code == 2, result.output
    assert "bomb.json.gz" in result.stderr and "--max-file-size" in result.stderr
    assert len(_lines(result.stdout)) == 3
    raised = runner.invoke(app, ["replay", str(traces), "--json", "--max-file-size", "8M", *PINNED])
    assert "decompresses to more than" not in raised.stderr
    bad = runner.invoke(app, ["replay", str(traces), "--max-file-size", "lots"])
    assert bad.exit_code == 2 and "--max-file-size (or TRIPWIRE_MAX_FILE_SIZE)" in bad.stderr


def test_a_cap_far_above_the_memory_reads_files_and_standard_input_as_they_are(traces: Path) -> None:
    # The cap is a limit, not a buffer: a read of "up to 64 GiB" asked for 64 GiB at once.
    small = runner.invoke(app, ["replay", str(traces), "--json", *PINNED])
    huge = runner.invoke(app, ["replay", str(traces), "--json", "--max-file-size", "64G", *PINNED])
    assert huge.exit_code == small.exit_code == 0, huge.output
    assert huge.stdout == small.stdout and len(_lines(huge.stdout)) == 3
    piped = runner.invoke(app, ["replay", "-", "--json", "--max-file-size", "64G", *PINNED],
                          input=(traces / "loop.json").read_bytes())
    assert piped.exit_code == 0, piped.output
    assert [o["trace_id"] for o in _lines(piped.stdout)] == [f"{1:032x}"]


def test_verdicts_carry_their_source_files(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces), "--json", *PINNED])
    by_id = {o["trace_id"]: o for o in _lines(result.stdout)}
    assert by_id[f"{1:032x}"]["sources"] == [str(traces / "loop.json")]
    table = runner.invoke(app, ["replay", str(traces), *PINNED])
    assert str(traces / "loop.json") in table.stdout


def test_a_piped_table_keeps_every_column_and_stderr_is_not_wrapped(traces: Path) -> None:
    narrow = CliRunner(env={"COLUMNS": "40", "NO_COLOR": "1"})  # a pipe: not a terminal
    result = narrow.invoke(app, ["replay", str(traces), *PINNED])
    assert result.exit_code == 0, result.output
    (row,) = [x for x in result.stdout.splitlines() if "looper" in x]  # one line, not folded
    assert "call 4 · repetition" in row and "lookup" in row and "x4" in row
    assert str(traces / "loop.json") in row
    missing = narrow.invoke(app, ["replay", str(traces / "nope.json"), str(traces)])
    (line,) = [x for x in missing.stderr.splitlines() if "nope.json" in x]
    assert line.endswith("no such file or directory")


def test_replay_traces_of_a_missing_path_raises() -> None:
    from tripwire.errors import InputError
    from tripwire.replay.engine import replay_traces

    with pytest.raises(InputError) as info:
        list(replay_traces("no/such/dir/"))
    assert info.value.source == "no/such/dir/"
    problems: list[Any] = []
    assert list(replay_traces("no/such/dir/", problems=problems)) == []
    assert len(problems) == 1


def test_an_error_in_a_variable_names_the_variable_not_the_option(traces: Path) -> None:
    result = runner.invoke(app, ["replay", str(traces)], env={"TRIPWIRE_WINDOW": "2"})
    assert result.exit_code == 2, result.output
    assert "TRIPWIRE_WINDOW 2" in result.stderr and "--window" not in result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal of the Linux kind")
def test_on_a_terminal_the_bars_say_reading_then_replaying(tmp_path: Path) -> None:
    import os
    import pty
    import subprocess

    d = tmp_path / "many"
    d.mkdir()
    for t in range(1, 1201):  # 1,200 traces in 240 files: past the bar's threshold of 200 files
        _write(d / f"t-{t // 5:04d}-{t % 5}.json", _working(t, 2))
    main_fd, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "CI")} | {"COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "replay", str(d), "--json"],
        stdout=subprocess.DEVNULL, stderr=terminal, env=env,
    )
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the terminal's other end closed: the process is done
            break
        if not chunk:
            break
        seen += chunk
    os.close(main_fd)
    assert proc.wait(timeout=120) == 0
    text = seen.decode(errors="replace")
    assert "reading traces" in text
    assert "replaying traces" in text and "1,200/1,200 traces" in text
