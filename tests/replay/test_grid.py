"""Calibration library: the grid, the Pareto front, the recommendation, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from replay_otlp import distinct, dumps, repeated, request

from tripwire.core.policy import KeyMode, LoopPolicy
from tripwire.errors import ConfigError
from tripwire.replay.calibrate import (
    Label,
    PolicyScore,
    assign_labels,
    calibrate,
    learn_step_line,
    load_labels,
    min_runs_for,
    pareto_front,
    policy_grid,
)
from tripwire.replay.engine import load_traces

BASE = LoopPolicy(name="t", result_evidence="off", max_period=None)


def _score(catch: int, fa: int, delay: float | None) -> PolicyScore:
    return PolicyScore(policy=BASE, incidents=10, caught=catch, healthy=10, false_alarms=fa,
                       median_delay=delay, median_flag_position=None, saved_share=0.0, cut_share=0.0)


def test_pareto_front_by_hand() -> None:
    scores = [
        _score(5, 0, 3.0),   # front: nothing catches more with no false alarm
        _score(4, 0, 3.0),   # dominated by 0
        _score(8, 2, 3.0),   # front
        _score(8, 3, 3.0),   # dominated by 2
        _score(5, 0, 2.0),   # front, and dominates 0 (shorter delay)
        _score(5, 0, None),  # no delay counts as the worst: dominated
    ]
    assert pareto_front(scores) == {2, 4}


def test_grid_skips_thresholds_above_the_window() -> None:
    grid = policy_grid(BASE, windows=[3, 10], thresholds=[2, 4], keys=[KeyMode.TOOL_ARGS], max_periods=[None, 3])
    assert [(p.max_period, p.window, p.threshold) for p in grid] == [
        (None, 3, 2), (None, 10, 2), (None, 10, 4), (3, 3, 2), (3, 10, 2), (3, 10, 4),
    ]
    assert all(p.result_evidence.value == "off" for p in grid)


def _labelled(tmp_path: Path) -> list:
    (tmp_path / "a.json").write_text(dumps(request(repeated(1, 8), repeated(2, 6), distinct(3, 12), repeated(4, 5))))
    loaded = load_traces(tmp_path / "a.json")
    labels = tmp_path / "labels.jsonl"
    labels.write_text(
        "\n".join(
            [
                json.dumps({"trace_id": f"{1:032x}", "incident": True}),
                json.dumps({"trace_id": f"{2:032x}", "label": "runaway", "incident_from": 3}),
                json.dumps({"trace_id": f"{3:032x}", "incident": False}),
                json.dumps({"trace_id": f"{4:032x}", "label": "healthy"}),
                json.dumps({"trace_id": f"{99:032x}", "incident": False}),
            ]
        )
    )
    label_set = load_labels(labels)
    pairs, unmatched = assign_labels(loaded.traces, label_set)
    assert unmatched == 1
    assert [p.label for p in pairs] == [Label(True), Label(True, 3), Label(False), Label(False)]
    return pairs


def test_recommendation_under_the_cap(tmp_path: Path) -> None:
    pairs = _labelled(tmp_path)
    grid = policy_grid(BASE, windows=[10], thresholds=[4, 5, 6], keys=[KeyMode.TOOL_ARGS], max_periods=[None])
    result = calibrate(pairs, grid, max_false_alarms=0.0, shippable_only=False)
    # threshold 4: catches both incidents (8 and 6 calls) but flags healthy trace 4 (5 calls);
    # 5: both incidents, and trace 4 too (5 identical calls); 6: both incidents, no alarm.
    got = [(s.caught, s.false_alarms) for s in result.scores]
    assert got == [(2, 1), (2, 1), (2, 0)]
    assert result.recommended == 2
    assert [s.recommended for s in result.scores] == [False, False, True]
    assert [s.ships for s in result.scores] == [True, False, False]
    assert result.scores[2].caveat == "threshold 6 lets the 4th identical call run"
    # Delays at threshold 6: trip at call 6 in both; began at 1 and 3: 5 and 3.
    assert result.scores[2].median_delay == 4.0
    # Saved: (8-6) + (6-6) of 14 incident calls.
    assert result.scores[2].saved_share == pytest.approx(2 / 14)
    # Cut at threshold 4: trace 4 trips at call 4 of 5, healthy calls 12 + 5.
    assert result.scores[0].cut_share == pytest.approx(1 / 17)


def test_a_setting_that_breaks_a_promise_is_marked_and_not_recommended_unless_asked(tmp_path: Path) -> None:
    pairs = _labelled(tmp_path)
    grid = policy_grid(BASE, windows=[10], thresholds=[3, 4, 6], keys=list(KeyMode), max_periods=[None])
    caveats = {(s.policy.key, s.policy.threshold): s.caveat for s in calibrate(pairs, grid).scores}
    assert caveats[(KeyMode.TOOL_ARGS, 4)] == ""
    assert caveats[(KeyMode.TOOL_ARGS, 3)] == "threshold 3 stops an identical call before the 4th"
    assert caveats[(KeyMode.TOOL, 4)] == "key 'tool' counts a batch of different calls to one tool as a loop"
    assert caveats[(KeyMode.TOOL, 3)].startswith("threshold 3 stops") and "key 'tool'" in caveats[(KeyMode.TOOL, 3)]
    # Under a cap of 0 only threshold 6 flags no healthy trace: not recommended as is...
    strict = calibrate(pairs, grid, max_false_alarms=0.0)
    assert strict.recommended is None and not any(s.recommended for s in strict.scores)
    assert any(s.false_alarms == 0 and not s.ships for s in strict.scores)
    # ... but when asked; and with a looser cap the shippable threshold 4 is the one.
    asked = calibrate(pairs, grid, max_false_alarms=0.0, shippable_only=False)
    assert asked.recommended is not None and asked.scores[asked.recommended].policy.threshold == 6
    loose = calibrate(pairs, grid, max_false_alarms=0.5)
    assert loose.recommended is not None
    best = loose.scores[loose.recommended]
    assert (best.policy.key, best.policy.threshold, best.ships) == (KeyMode.TOOL_ARGS, 4, True)
    # The looser cap would have taken threshold 3 (it catches as many, sooner) had it been allowed.
    free = calibrate(pairs, grid, max_false_alarms=0.5, shippable_only=False)
    assert free.recommended is not None and free.scores[free.recommended].policy.threshold == 3
    assert best.to_json()["ships"] is True and best.to_json()["caveat"] == ""


def test_workers_give_the_same_result(tmp_path: Path) -> None:
    pairs = _labelled(tmp_path)
    grid = policy_grid(BASE, windows=[5, 10], thresholds=[3, 4, 5], keys=list(KeyMode), max_periods=[None, 3])
    serial = calibrate(pairs, grid, workers=1)
    pooled = calibrate(pairs, grid, workers=2)
    assert [s.to_json() for s in serial.scores] == [s.to_json() for s in pooled.scores]
    assert serial.recommended == pooled.recommended


def test_invalid_cap() -> None:
    with pytest.raises(ConfigError):
        calibrate([], [BASE], max_false_alarms=1.5)


# -- the learned step line (split-conformal) --------------------------------------------------------


def test_step_line_is_the_conformal_order_statistic() -> None:
    # 39 runs at alpha=0.05: k = ceil(40 * 0.95) = 38, the second-largest count.
    counts = list(range(100, 139))
    line = learn_step_line(reversed(counts), alpha=0.05)
    assert (line.max_tool_calls, line.rank, line.runs, line.alpha) == (137, 38, 39, 0.05)
    # 19 runs is the fewest alpha=0.05 allows: k = ceil(20 * 0.95) = 19, the largest.
    assert learn_step_line([5] * 18 + [40], alpha=0.05).max_tool_calls == 40
    assert min_runs_for(0.05) == 19
    assert min_runs_for(0.01) == 99
    assert min_runs_for(0.5) == 1


def test_step_line_stops_at_most_alpha_of_the_runs_it_was_learned_from() -> None:
    counts = [3, 8, 8, 9, 12, 15, 15, 15, 20, 21, 22, 30, 31, 33, 40, 41, 47, 50, 66, 90, 120]
    for alpha in (0.05, 0.1, 0.2, 0.3):
        line = learn_step_line(counts, alpha=alpha).max_tool_calls
        over = sum(c > line for c in counts)
        assert over <= alpha * (len(counts) + 1)


def test_step_line_refuses_below_the_minimum_number_of_runs() -> None:
    with pytest.raises(ConfigError) as info:
        learn_step_line([10] * 18, alpha=0.05)
    assert info.value.field == "healthy runs"
    assert info.value.value == 18
    assert "at least 19 healthy runs" in str(info.value)
    with pytest.raises(ConfigError) as info:
        learn_step_line([], alpha=0.2)
    assert info.value.value == 0


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1.5, True, "0.05", float("nan")])
def test_step_line_rejects_a_bad_alpha(alpha: object) -> None:
    with pytest.raises(ConfigError) as info:
        learn_step_line([1] * 200, alpha=alpha)  # type: ignore[arg-type]
    assert info.value.field == "alpha"


@pytest.mark.parametrize("count", [-1, 2.5, True, None])
def test_step_line_rejects_a_bad_count(count: object) -> None:
    with pytest.raises(ConfigError) as info:
        learn_step_line([1] * 30 + [count], alpha=0.05)  # type: ignore[list-item]
    assert info.value.field == "counts"
