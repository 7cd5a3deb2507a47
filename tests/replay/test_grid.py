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
    load_labels,
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
    result = calibrate(pairs, grid, max_false_alarms=0.0)
    # threshold 4: catches both incidents (8 and 6 calls) but flags healthy trace 4 (5 calls);
    # 5: both incidents, and trace 4 too (5 identical calls); 6: both incidents, no alarm.
    got = [(s.caught, s.false_alarms) for s in result.scores]
    assert got == [(2, 1), (2, 1), (2, 0)]
    assert result.recommended == 2
    assert [s.recommended for s in result.scores] == [False, False, True]
    # Delays at threshold 6: trip at call 6 in both; began at 1 and 3: 5 and 3.
    assert result.scores[2].median_delay == 4.0
    # Saved: (8-6) + (6-6) of 14 incident calls.
    assert result.scores[2].saved_share == pytest.approx(2 / 14)
    # Cut at threshold 4: trace 4 trips at call 4 of 5, healthy calls 12 + 5.
    assert result.scores[0].cut_share == pytest.approx(1 / 17)


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
