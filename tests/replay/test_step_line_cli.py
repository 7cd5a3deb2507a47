"""``tripwire calibrate --line-alpha``: the learned step line, printed and written as limits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from replay_otlp import distinct, dumps, request
from typer.testing import CliRunner

from tripwire.cli import app
from tripwire.replay.calibrate import assign_labels, learn_step_lines, load_labels
from tripwire.replay.engine import load_traces

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _corpus(tmp_path: Path) -> Path:
    # Healthy runs of 4..12 calls, one incident of 30 calls, all from one source.
    labels = []
    for n in range(4, 13):
        (tmp_path / f"ok{n}.json").write_text(dumps(request(distinct(n, n))))
        labels.append({"file": f"ok{n}.json", "label": "healthy", "source": "batch"})
    (tmp_path / "long.json").write_text(dumps(request(distinct(99, 30))))
    labels.append({"file": "long.json", "label": "runaway", "source": "batch"})
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in labels))
    return path


def test_the_line_is_learned_per_source_and_written_as_limits(tmp_path: Path) -> None:
    labels = _corpus(tmp_path)
    out = tmp_path / "tripwire.toml"
    result = CliRunner().invoke(
        app,
        ["calibrate", str(tmp_path), "--labels", str(labels), "--windows", "10", "--thresholds", "4",
         "--keys", "tool+args", "--max-periods", "off", "--line-alpha", "0.2", "--line-per", "source",
         "--write-limits", str(out)],
    )
    assert result.exit_code == 0, result.output
    # 9 healthy runs at alpha=0.2: rank ceil(10 * 0.8) = 8, the 8th shortest: 11 calls.
    data = tomllib.loads(out.read_text())
    assert data["version"] == 1
    assert data["limits"] == {"max_tool_calls": 11}
    assert "batch" in result.output
    again = CliRunner().invoke(
        app, ["calibrate", str(tmp_path), "--labels", str(labels), "--line-alpha", "0.2", "--write-limits", str(out)]
    )
    assert again.exit_code == 2
    assert "exists" in again.output


def test_too_few_healthy_runs_refuse_a_line_and_write_nothing(tmp_path: Path) -> None:
    labels = _corpus(tmp_path)
    out = tmp_path / "tripwire.toml"
    result = CliRunner().invoke(
        app, ["calibrate", str(tmp_path), "--labels", str(labels), "--line-alpha", "0.05", "--line-per", "all",
              "--write-limits", str(out)],
    )
    assert result.exit_code == 2
    assert "needs at least 19 healthy runs, got 9" in " ".join(result.output.split())
    assert not out.exists()


def test_write_limits_needs_an_alpha_and_bad_values_are_usage_errors(tmp_path: Path) -> None:
    labels = _corpus(tmp_path)
    base = ["calibrate", str(tmp_path), "--labels", str(labels)]
    for extra in (["--write-limits", str(tmp_path / "x.toml")], ["--line-alpha", "1.5"], ["--line-alpha", "0.1", "--line-per", "model"]):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2, extra
        assert "Traceback" not in result.output


def test_learned_lines_by_agent_say_what_they_would_stop(tmp_path: Path) -> None:
    labels = _corpus(tmp_path)
    pairs, _ = assign_labels(load_traces(tmp_path).traces, load_labels(labels))
    [group] = learn_step_lines(pairs, alpha=0.2, per="source")
    assert (group.group, group.healthy, group.incidents, group.incidents_over, group.healthy_over) == ("batch", 9, 1, 1, 1)
    assert group.line is not None and group.line.max_tool_calls == 11


def test_with_json_the_lines_are_json_too(tmp_path: Path) -> None:
    labels = _corpus(tmp_path)
    result = CliRunner().invoke(
        app,
        ["calibrate", str(tmp_path), "--labels", str(labels), "--windows", "10", "--thresholds", "4",
         "--keys", "tool+args", "--max-periods", "off", "--line-alpha", "0.2", "--line-per", "source", "--json"],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]  # no table among them
    assert "catch_rate" in lines[0]
    assert lines[-1] == {"step_line": {"per": "source", "group": "batch", "alpha": 0.2, "healthy": 9, "incidents": 1,
                                       "max_tool_calls": 11, "incidents_over": 1, "healthy_over": 1, "refused": None}}


def _two_sources(tmp_path: Path, names: tuple[str, str]) -> Path:
    labels = []
    for s, source in enumerate(names):
        for n in range(4, 10):
            name = f"s{s}_{n}.json"
            (tmp_path / name).write_text(dumps(request(distinct(100 * s + n, n + 10 * s))))
            labels.append({"file": name, "label": "healthy", "source": source})
        (tmp_path / f"long{s}.json").write_text(dumps(request(distinct(900 + s, 40))))
        labels.append({"file": f"long{s}.json", "label": "runaway", "source": source})
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in labels))
    return path


def test_groups_whose_names_make_one_file_name_get_a_file_each(tmp_path: Path) -> None:
    labels = _two_sources(tmp_path, ("team/a", "team:a"))
    out = tmp_path / "limits" / "tripwire.toml"
    out.parent.mkdir()
    result = CliRunner().invoke(
        app, ["calibrate", str(tmp_path), "--labels", str(labels), "--line-alpha", "0.2", "--line-per", "source",
              "--write-limits", str(out)],
    )
    assert result.exit_code == 0, result.output
    files = sorted(out.parent.iterdir())
    assert len(files) == 2 and all(f.name.startswith("tripwire.team_a-") for f in files)
    lines = sorted(tomllib.loads(f.read_text())["limits"]["max_tool_calls"] for f in files)
    assert lines[0] < 10 < lines[1]  # each group's own line (4..9 calls, and 14..19)


def test_a_file_in_the_way_writes_none_of_the_set(tmp_path: Path) -> None:
    labels = _two_sources(tmp_path, ("alpha", "beta"))
    out = tmp_path / "limits" / "tripwire.toml"
    out.parent.mkdir()
    (out.parent / "tripwire.beta.toml").write_text("# mine\n")
    args = ["calibrate", str(tmp_path), "--labels", str(labels), "--line-alpha", "0.2", "--line-per", "source",
            "--write-limits", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "tripwire.beta.toml exists" in " ".join(result.output.split())
    assert sorted(f.name for f in out.parent.iterdir()) == ["tripwire.beta.toml"]  # alpha's not written either
    assert (out.parent / "tripwire.beta.toml").read_text() == "# mine\n"
    (out.parent / "tripwire.beta.toml").unlink()
    assert CliRunner().invoke(app, args).exit_code == 0
    assert sorted(f.name for f in out.parent.iterdir()) == ["tripwire.alpha.toml", "tripwire.beta.toml"]
