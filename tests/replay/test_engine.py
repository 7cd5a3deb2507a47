"""Replay engine: grouping across files, ordering, first trip and final verdict per trace.

Expectations are worked out by hand from the rules (DESIGN.md, job 1), with a policy pinned
field by field so that tuning the defaults does not move them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_otlp import agent_span, distinct, dumps, repeated, request, tool_span, trace_id

from tripwire.core.policy import KeyMode, LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.signature import Normalizer
from tripwire.replay.engine import TraceResult, load_traces, replay_trace, replay_traces
from tripwire.replay.reader import Problem, read_spans

POLICY = LoopPolicy(
    name="test",
    window=10,
    threshold=4,
    key=KeyMode.TOOL_ARGS,
    max_period=3,
    min_repeats=3,
    same_error=None,
    result_evidence="off",
    require_evidence=False,
    name_only="uncertain",
    confirm=1,
)


def _file(tmp_path: Path, name: str, *groups: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(dumps(request(*groups)))
    return path


def _one(source: object, policy: LoopPolicy = POLICY, **kw: object) -> TraceResult:
    (result,) = list(replay_traces(source, policy, **kw))  # type: ignore[arg-type]
    return result


def test_eight_identical_calls_trip_at_the_fourth(tmp_path: Path) -> None:
    r = _one(_file(tmp_path, "a.json", repeated(1, 8)))
    assert r.trace_id == trace_id(1)
    assert r.agent == "looper"
    assert r.tool_calls == 8
    assert r.verdict is Verdict.STUCK
    assert r.first_trip is not None
    assert (r.first_trip.call_index, r.first_trip.tool, r.first_trip.rule) == (4, "search_docs", Rule.REPETITION)
    assert (r.first_trip.period, r.first_trip.hits) == (1, 4)
    assert r.first_trip.digest is not None and len(r.first_trip.digest) == 32
    assert r.calls_after_trip == 4
    assert r.arguments_seen is True
    assert r.policy_version == POLICY.version


def test_three_identical_calls_do_not_trip(tmp_path: Path) -> None:
    r = _one(_file(tmp_path, "a.json", repeated(1, 3)))
    assert (r.verdict, r.first_trip, r.calls_after_trip) == (Verdict.WORKING, None, 0)


def test_seed_preset_is_the_plain_repetition_rule(tmp_path: Path) -> None:
    r = _one(_file(tmp_path, "a.json", repeated(1, 8)), LoopPolicy.preset("seed"))
    assert r.first_trip is not None and r.first_trip.call_index == 4 and r.calls_after_trip == 4


def test_one_trace_across_two_files_and_two_resource_spans_out_of_order(tmp_path: Path) -> None:
    # Calls by start time: a b a b a b (a = lookup{x:1}, b = fetch{y:2}). Read in file order
    # they would be a a a b b b, which trips nothing under threshold 4.
    def a(span: int, at: int) -> dict:
        return tool_span(9, span, "lookup", {"x": 1}, at=at)

    def b(span: int, at: int) -> dict:
        return tool_span(9, span, "fetch", {"y": 2}, at=at)

    f1 = _file(tmp_path, "1.json", [a(15, 5)], [a(13, 3), a(11, 1)])
    f2 = _file(tmp_path, "2.json", [b(16, 6), b(14, 4), b(12, 2), agent_span(9, 1, "cycler")])
    r = _one([f1, f2])
    assert r.tool_calls == 6
    assert r.agent == "cycler"
    assert r.first_trip is not None
    # A B repeated 3 times back to back (min_repeats=3): complete at call 6.
    assert (r.first_trip.call_index, r.first_trip.rule, r.first_trip.period, r.first_trip.hits) == (6, Rule.PERIOD, 2, 3)
    assert r.first_trip.tool == "fetch"
    assert r.calls_after_trip == 0
    assert r.verdict is Verdict.STUCK
    assert r.sources == (str(f1), str(f2))


def test_recovery_after_a_whole_window_without_trips(tmp_path: Path) -> None:
    spans = repeated(1, 4) + [
        tool_span(1, 200 + i, "fetch_page", {"page": i}, at=10 + i) for i in range(12)
    ]
    r = _one(_file(tmp_path, "a.json", spans))
    assert r.tool_calls == 16
    assert r.first_trip is not None and r.first_trip.call_index == 4
    assert r.calls_after_trip == 12
    # The loop verdict holds until a whole window (10 calls) passes without a trip: call 14.
    assert r.verdict is Verdict.WORKING


def test_trace_without_tool_calls_is_reported_unless_skip_empty(tmp_path: Path) -> None:
    f = _file(tmp_path, "a.json", [agent_span(3, 1, "idle")], repeated(4, 2))
    results = list(replay_traces(f, POLICY))
    assert [r.trace_id for r in results] == [trace_id(3), trace_id(4)]
    empty = results[0]
    assert (empty.tool_calls, empty.verdict, empty.first_trip, empty.calls_after_trip) == (0, Verdict.WORKING, None, 0)
    assert empty.agent == "idle"
    assert [r.trace_id for r in replay_traces(f, POLICY, skip_empty=True)] == [trace_id(4)]


def test_trace_without_arguments_is_uncertain_by_default_and_stuck_with_tool_key(tmp_path: Path) -> None:
    spans = [agent_span(2, 1, "blind")] + [
        tool_span(2, 100 + i, "fetch_page", None, at=i + 1) for i in range(6)
    ]
    f = _file(tmp_path, "b.json", spans)
    r = _one(f)
    assert r.arguments_seen is False
    assert r.verdict is Verdict.UNCERTAIN
    assert r.first_trip is None and r.calls_after_trip == 0
    assert "argument capture" in r.reason

    r = _one(f, POLICY.evolve(key=KeyMode.TOOL))
    assert r.verdict is Verdict.STUCK
    assert r.first_trip is not None and r.first_trip.call_index == 4 and r.calls_after_trip == 2
    assert r.arguments_seen is False


def test_the_same_span_in_two_files_counts_once(tmp_path: Path) -> None:
    spans = repeated(1, 3)
    f1 = _file(tmp_path, "1.json", spans)
    f2 = _file(tmp_path, "2.json", spans[1:])  # a retried export of the same spans
    loaded = load_traces([f1, f2])
    assert loaded.duplicates == 3
    assert len(loaded.traces[0].calls) == 3
    assert _one([f1, f2]).first_trip is None  # 3 calls, not 6


def test_partial_reports_of_one_call_count_once(tmp_path: Path) -> None:
    spans = [
        tool_span(1, 10 + i, "search", {"q": "x"}, at=i + 1, call_id=f"c{i % 3}") for i in range(6)
    ]
    r = _one(_file(tmp_path, "a.json", spans))
    assert r.tool_calls == 3
    assert r.first_trip is None


def test_interleaved_traces_in_one_file(tmp_path: Path) -> None:
    loop, work = repeated(1, 5), distinct(2, 5)
    mixed = [x for pair in zip(loop, work, strict=False) for x in pair] + loop[len(work):]
    results = {r.trace_id: r for r in replay_traces(_file(tmp_path, "a.json", mixed), POLICY)}
    assert results[trace_id(1)].first_trip is not None
    assert results[trace_id(1)].first_trip.call_index == 4  # type: ignore[union-attr]
    assert results[trace_id(2)].first_trip is None
    assert results[trace_id(2)].agent == "researcher"


def test_volatile_keys_from_the_normalizer(tmp_path: Path) -> None:
    spans = [tool_span(1, 10 + i, "search", {"q": "x", "cursor": i}, at=i + 1) for i in range(5)]
    f = _file(tmp_path, "a.json", spans)
    assert _one(f).first_trip is None
    norm = Normalizer().with_volatile_keys(add=["cursor"])
    r = _one(f, normalizer=norm)
    assert r.first_trip is not None and r.first_trip.call_index == 4
    assert r.normalizer_version == norm.version != Normalizer().version


def test_span_views_instead_of_paths(tmp_path: Path) -> None:
    views = list(read_spans([_file(tmp_path, "a.json", repeated(1, 8))]))
    r = _one(views)
    assert r.first_trip is not None and r.first_trip.call_index == 4


def test_problems_are_collected_and_the_rest_replayed(tmp_path: Path) -> None:
    good = _file(tmp_path, "good.json", repeated(1, 8))
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [')
    problems: list[Problem] = []
    results = list(replay_traces([bad, good], POLICY, problems=problems))
    assert len(results) == 1 and results[0].first_trip is not None
    assert [p.source for p in problems] == [str(bad)]


def test_many_policies_over_one_parse(tmp_path: Path) -> None:
    loaded = load_traces(_file(tmp_path, "a.json", repeated(1, 8)))
    (trace,) = loaded.traces
    trips = [replay_trace(trace, POLICY.evolve(threshold=t)).first_trip for t in (2, 4, 8)]
    assert [t.call_index if t else None for t in trips] == [2, 4, 8]


def test_json_shape(tmp_path: Path) -> None:
    obj = _one(_file(tmp_path, "a.json", repeated(1, 8))).to_json()
    assert set(obj) >= {
        "trace_id", "agent", "tool_calls", "verdict", "first_trip", "calls_after_trip",
        "arguments_seen", "policy_version", "normalizer_version",
    }
    assert obj["verdict"] == "stuck"
    assert obj["first_trip"] == {
        "call_index": 4, "tool": "search_docs", "rule": "repetition", "period": 1, "hits": 4,
        "digest": obj["first_trip"]["digest"],
    }
    assert "refund" not in repr(obj)  # digests, never raw arguments


@pytest.mark.parametrize("n, expected", [(4, 4), (5, 4), (12, 4)])
def test_first_trip_is_where_stuck_began(tmp_path: Path, n: int, expected: int) -> None:
    r = _one(_file(tmp_path, "a.json", repeated(1, n)))
    assert r.first_trip is not None and r.first_trip.call_index == expected
    assert r.calls_after_trip == n - expected
