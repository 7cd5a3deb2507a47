"""The demo fleet: each scenario ends the way issue 2 says it must."""

from __future__ import annotations

from typer.testing import CliRunner

from tripwire.cli import app
from tripwire.core.reasons import Verdict
from tripwire.demo import play, scenarios


def _by_prefix(prefix: str):  # type: ignore[no-untyped-def]
    (scenario,) = [s for s in scenarios() if s.name.startswith(prefix)]
    return play(scenario, max_iterations=10)


def test_deep_research_is_cut_by_the_cap_and_left_alone_by_tripwire() -> None:
    o = _by_prefix("deep research")
    assert o.planned == 80
    assert o.cap_stop == 10 and o.cut_off(o.cap_stop) == 70
    assert o.tripwire_stop is None and o.verdict is Verdict.WORKING


def test_stuck_agent_is_stopped_at_call_4_the_cap_only_at_10() -> None:
    o = _by_prefix("stuck")
    assert o.tripwire_stop == 4
    assert o.cap_stop == 10 and o.wasted(o.cap_stop) == 6
    assert o.verdict is Verdict.STUCK


def test_oscillation_is_stuck_with_period_2_at_call_6() -> None:
    o = _by_prefix("oscillating")
    assert o.tripwire_stop == 6
    assert "cycle of 2" in o.reason


def test_the_explained_repetitions_get_their_verdicts() -> None:
    assert _by_prefix("paginated").verdict is Verdict.WORKING
    assert _by_prefix("rate-limited").verdict is Verdict.RETRYING
    assert _by_prefix("polling an approval").verdict is Verdict.WAITING
    assert _by_prefix("repeated writes").verdict is Verdict.UNCERTAIN
    for prefix in ("paginated", "rate-limited", "polling an approval", "repeated writes"):
        assert _by_prefix(prefix).tripwire_stop is None


def test_demo_command_prints_the_table_and_totals() -> None:
    result = CliRunner().invoke(app, ["demo"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # rich wraps lines at the terminal width
    assert "A flat cap vs tripwire" in text
    assert "flat cap: 10 calls wasted in loops, 70 useful calls cut off." in text
    assert "tripwire: 0 wasted, 0 cut off." in text
    # A reason's hint to the config file is text, not markup: its section name is printed.
    assert "[policy.polls.read]" in text and "[policy.polls.search_docs]" in text


def test_version_and_help() -> None:
    runner = CliRunner()
    version = runner.invoke(app, ["--version"])
    assert version.exit_code == 0 and version.output.startswith("tripwire ")
    helped = runner.invoke(app, ["-h"])
    assert helped.exit_code == 0 and "demo" in helped.output
