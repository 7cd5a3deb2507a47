"""The fleet detector alone (pure: spans in, decisions out; the clock handed in)."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core.budget import Limits
from tripwire.serve.fleet import Fleet, Outcome
from tripwire.spans import SpanView

TID = "ab" * 16


def _tool(i: int, *, args: dict[str, object] | None = None, result: str = "No results.", call_id: str | None = None, error: bool = False, tid: str = TID) -> SpanView:
    attrs: dict[str, object] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search_docs",
        "gen_ai.tool.call.id": call_id or f"call_{i}",
        "gen_ai.tool.call.arguments": json.dumps(args if args is not None else {"query": "refund policy"}),
        "gen_ai.tool.call.result": result,
    }
    return SpanView(trace_id=tid, span_id=f"{i + 1:016x}", parent_span_id="f" * 16, name="execute_tool search_docs",
                    start_s=1000.0 + i, end_s=1000.5 + i, status_error=error, exception_type="TimeoutError" if error else None, attributes=attrs)


def _model(i: int, tokens: int = 100, cost: float | None = None, tid: str = TID) -> SpanView:
    attrs: dict[str, object] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.usage.input_tokens": tokens, "gen_ai.usage.output_tokens": 10}
    return SpanView(trace_id=tid, span_id=f"{i + 500:016x}", parent_span_id="f" * 16, name="chat gpt-4o", start_s=999.0 + i, end_s=999.2 + i, attributes=attrs)


def _root(*, error: bool = False, tid: str = TID) -> SpanView:
    return SpanView(trace_id=tid, span_id="f" * 16, name="invoke_agent looper", start_s=999.0, end_s=2000.0, status_error=error,
                    attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"})


def test_a_loop_is_stuck_at_the_fourth_call_and_raises_one_kill() -> None:
    fleet = Fleet(reorder_s=0)
    kills, transitions = [], []
    for i in range(8):
        out = fleet.process([_tool(i)], now=1.0 + i)
        kills += out.kills
        transitions += out.transitions
    assert [(t.verdict, t.rule) for t in transitions] == [("stuck", "repetition")]
    first = [k for k in kills if not k.again]
    assert len(first) == 1 and first[0].assessment is not None and first[0].assessment.call_index == 4
    # Each further repeat re-asserts the stop (a lowered flag goes up again): calls 5 to 8.
    assert len(kills) == 5 and all(k.again for k in kills[1:])
    out = fleet.process([_root()], now=20.0)
    (row,) = out.ended_runs
    assert (row.status, row.verdict, row.first_stuck_call, row.calls_after_stuck) == ("ended", "stuck", 4, 4)
    assert row.health == "stuck" and row.receipt is not None and row.receipt["reason"] == "loop_detected"
    assert len(fleet) == 0


def test_thirty_different_useful_calls_are_left_alone() -> None:
    fleet = Fleet(reorder_s=0)
    views = [_tool(i, args={"query": f"topic {w}"}, result=f"found {w}") for i, w in enumerate("abcdefghijklmnopqrstuvwxyz1234")]
    out = fleet.process([*views, _root()], now=5.0)
    assert out.transitions == [] and out.kills == []
    (row,) = out.ended_runs
    assert (row.verdict, row.tool_calls, row.health) == ("working", 30, "complete_unverified")
    assert row.receipt is not None and row.receipt["reason"] == "completed"


def test_a_tool_call_cap_stops_the_run_once() -> None:
    fleet = Fleet(reorder_s=0, limits=Limits(max_tool_calls=5))
    out = fleet.process([_tool(i, args={"q": i}, result=str(i)) for i in range(7)], now=1.0)
    assert [k.reason.value for k in out.kills] == ["max_tool_calls"]
    assert out.kills[0].stop is not None and out.kills[0].stop.limit == 5


def test_model_spans_count_steps_tokens_and_stop_at_the_step_cap() -> None:
    fleet = Fleet(reorder_s=0, limits=Limits(max_steps=3))
    out = fleet.process([_model(i) for i in range(4)], now=1.0)
    assert [k.reason.value for k in out.kills] == ["max_steps"]
    run = fleet.process([_root()], now=2.0).ended_runs[0]
    assert (run.steps, run.input_tokens, run.output_tokens) == (4, 400, 40)
    assert run.receipt is not None and run.receipt["reason"] == "max_steps"
    assert run.health == "bounded_stop"


def test_a_failed_root_span_is_a_failed_run() -> None:
    fleet = Fleet(reorder_s=0)
    run = fleet.process([_tool(0), _root(error=True)], now=1.0).ended_runs[0]
    assert run.health == "failed"


def test_a_trace_that_goes_quiet_ends_without_claiming_a_finish() -> None:
    fleet = Fleet(reorder_s=0, idle_ttl_s=10)
    fleet.process([_tool(0)], now=1.0)
    out = fleet.process([], now=12.0)
    (run,) = out.ended_runs
    assert run.receipt is not None and run.receipt["end"] is None and run.receipt["reason"] is None
    assert run.health == "uncertain"


def test_a_span_reported_twice_counts_once_but_a_retry_after_an_error_counts_again() -> None:
    fleet = Fleet(reorder_s=0)
    fleet.process([_tool(0, call_id="x"), _tool(0, call_id="x")], now=1.0)
    fleet.process([_tool(1, call_id="y", error=True), _tool(2, call_id="y")], now=2.0)
    run = fleet.process([_root()], now=3.0).ended_runs[0]
    assert run.tool_calls == 3


def test_spans_are_judged_in_start_order_within_the_reorder_window() -> None:
    fleet = Fleet(reorder_s=0.5)
    early = fleet.process([_tool(3), _tool(2)], now=1.0)
    assert early.judged_calls == 0 and fleet.buffered == 2
    late = fleet.process([_tool(1), _tool(0)], now=1.2)
    assert late.judged_calls == 0
    done = fleet.process([], now=1.6)  # the first two are due; the last two at 1.7
    assert done.judged_calls == 2
    rest = fleet.process([], now=1.8)
    assert [t.verdict for t in rest.transitions] == ["stuck"]


def test_memory_is_bounded_by_max_traces() -> None:
    fleet = Fleet(reorder_s=0, max_traces=100)
    ended = 0
    for n in range(1000):
        ended += len(fleet.process([_tool(0, tid=f"{n + 1:032x}")], now=float(n)).ended_runs)
    assert len(fleet) == 100
    assert ended == 900


def test_a_transition_mid_batch_leaves_the_rows_counters_up_to_date() -> None:
    fleet = Fleet(reorder_s=0)
    out = fleet.process([_tool(i) for i in range(6)], now=1.0)
    (row,) = out.urgent.runs
    assert (row.verdict, row.first_stuck_call, row.tool_calls, row.calls_after_stuck) == ("stuck", 4, 6, 2)
    assert out.routine.runs == []  # one row per run and step, not two


_KINDS = st.sampled_from(["loop", "loop", "varied", "dup", "error", "model", "subagent", "root"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(st.integers(0, 3), _KINDS), max_size=60),
    limits=st.sampled_from([Limits(), Limits(max_tool_calls=9), Limits(max_steps=2)]),
)
def test_a_request_of_interleaved_traces_gives_each_trace_what_it_gets_span_by_span(
    steps: list[tuple[int, str]], limits: Limits
) -> None:
    # One request with every span against the same spans one request each, in the same order:
    # per trace, the same kills, transitions, verdict rows, timeline and end.
    views = []
    for i, (t, kind) in enumerate(steps):
        tid = f"{t + 1:032x}"
        if kind == "model":
            views.append(_model(i, tid=tid))
        elif kind == "subagent":
            views.append(SpanView(trace_id=tid, span_id=f"{i + 900:016x}", parent_span_id="f" * 16, name="invoke_agent helper",
                                  start_s=995.0, end_s=1000.0 + i, attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}))
        elif kind == "root":
            views.append(SpanView(trace_id=tid, span_id="f" * 16, name="invoke_agent looper", start_s=995.0, end_s=1000.0 + i,
                                  attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "looper"}))
        else:
            call_id = "same" if kind == "dup" else None
            args = {"query": f"topic {i}"} if kind == "varied" else None
            views.append(_tool(i, tid=tid, call_id=call_id, args=args, error=kind == "error"))
    # Judged by time: keep the order of the list (a tool at its start, a root at its end).
    views = [_retimed(v, 1000.0 + i) for i, v in enumerate(views)]

    def per_trace(outs: list[Outcome]) -> dict[tuple[str, str], list[object]]:
        got: dict[tuple[str, str], list[object]] = {}
        for out in outs:
            for k in out.kills:
                got.setdefault((k.trace_id, "kills"), []).append((k.reason, k.again, k.message))
            for t in out.transitions:
                got.setdefault((t.trace_id, "transitions"), []).append(t)
            for v in out.urgent.verdicts:
                got.setdefault((v.trace_id, "verdicts"), []).append(v)
            for c in [*out.urgent.calls, *out.routine.calls]:
                got.setdefault((c.trace_id, "calls"), []).append(c)
            for r in out.ended_runs:
                got.setdefault((r.trace_id, "ended"), []).append(r)
        return got

    together = Fleet(reorder_s=0, limits=limits)
    one_by_one = Fleet(reorder_s=0, limits=limits)
    expected = per_trace([one_by_one.process([v], now=1.0) for v in views])
    assert per_trace([together.process(views, now=1.0)]) == expected
    assert list(together._traces) == list(one_by_one._traces)
    assert list(together.engine._runs) == list(one_by_one.engine._runs)
    for tid in one_by_one._traces:
        assert together.verdict(tid) == one_by_one.verdict(tid)
    assert together.engine.stats == one_by_one.engine.stats


def _retimed(view: SpanView, at: float) -> SpanView:
    if view.parent_span_id is None:
        return dataclasses.replace(view, end_s=at)
    return dataclasses.replace(view, start_s=at, end_s=at + 0.5)


def test_the_row_written_at_a_transition_is_the_run_as_it_was_at_that_call() -> None:
    # The run ends in the same request, so the row made when it went stuck is not brought up
    # to date: it must hold the counters and time span of the fourth call, not of the sixth.
    fleet = Fleet(reorder_s=0)
    out = fleet.process([*(_tool(i) for i in range(6)), _root()], now=1.0)
    at_stuck, ended = out.urgent.runs
    assert (at_stuck.status, at_stuck.verdict, at_stuck.tool_calls, at_stuck.duration_s) == ("running", "stuck", 4, 3.5)
    assert (ended.status, ended.tool_calls, ended.duration_s) == ("ended", 6, 1001.0)


def test_the_rows_built_by_position_have_each_value_in_its_field() -> None:
    # The fleet builds RunRow and CallRow by position (cheaper): every field must get its value.
    fleet = Fleet(reorder_s=0)
    out = fleet.process([_tool(0, error=True, result="boom"), _model(1, tokens=7)], now=3.0)
    (call,) = out.routine.calls
    assert (call.trace_id, call.call_index, call.tool, call.error_type, call.verdict) == (TID, 1, "search_docs", "TimeoutError", "working")
    assert len(call.digest or "") == 32 and call.result_digest is not None and call.raw is None
    assert (call.start_s, call.end_s) == (1000.0, 1000.5)
    (run,) = out.routine.runs
    assert (run.trace_id, run.status, run.verdict, run.steps, run.tool_calls, run.input_tokens, run.output_tokens) == (TID, "running", "working", 1, 1, 7, 10)
    assert (run.health, run.killed, run.receipt, run.ended_at, run.created_at, run.updated_at) == (None, False, None, None, 3.0, 3.0)
    assert run.duration_s == 1000.5 - 1000.0 and run.cost_usd is not None and run.cost_usd > 0
    assert run.policy_version == fleet.policy.version and run.normalizer_version == fleet.normalizer.version


def test_the_timeline_keeps_a_runs_last_calls_when_one_request_brings_more_than_it_holds() -> None:
    # A Collector with tail sampling sends a long trace at once: the dashboard must show where
    # the run ended up (its last calls), not its first ones with the end missing.
    from tripwire.store.runs import MAX_CALLS_PER_RUN

    fleet = Fleet(reorder_s=0)
    first = fleet.process([_tool(i, args={"q": i}, result=str(i)) for i in range(300)], now=1.0)
    assert [c.call_index for c in [*first.urgent.calls, *first.routine.calls]] == list(range(1, 301))
    calls = MAX_CALLS_PER_RUN + 200
    views = [_tool(i, args={"q": i}, result=str(i)) for i in range(300, 300 + calls)]
    out = fleet.process(views, now=2.0)
    indexes = [c.call_index for c in [*out.urgent.calls, *out.routine.calls]]
    assert indexes == list(range(300 + calls - MAX_CALLS_PER_RUN + 1, 300 + calls + 1))
    (run,) = out.routine.runs
    assert run.tool_calls == 300 + calls


def _late_tool(i: int, tid: str = TID) -> SpanView:
    """A call of the run that reaches the receiver after its root span (another process's
    exporter, sending later), in another request."""
    return _tool(i, args={"query": f"late {i}"}, result=f"late {i}", tid=tid)


def test_a_span_that_comes_after_its_runs_root_leaves_the_ended_run_as_it_was() -> None:
    fleet = Fleet(reorder_s=0, idle_ttl_s=300)
    out = fleet.process([_tool(i, args={"q": i}, result=str(i)) for i in range(6)] + [_root()], now=10.0)
    (row,) = out.ended_runs
    assert (row.agent, row.tool_calls, row.status) == ("looper", 6, "ended")
    # Applied, the late call would start the run afresh (agent unknown, one call) and, a
    # quiet while later, end it again with a half-run receipt written over the real one.
    late = fleet.process([_late_tool(6), _late_tool(7)], now=11.0)
    assert late.late_spans == 2 and fleet.late_spans == 2
    assert late.urgent.runs == [] and late.routine.runs == [] and late.routine.calls == []
    assert late.judged_calls == 0 and len(fleet) == 0
    later = fleet.process([], now=11.0 + 301)
    assert later.ended_runs == [] and later.urgent.runs == [] and later.routine.runs == []


def test_a_call_after_the_root_in_the_same_request_is_late_too_but_other_traces_go_on() -> None:
    other = "cd" * 16
    fleet = Fleet(reorder_s=0)
    skewed = dataclasses.replace(_late_tool(9), start_s=2001.0, end_s=2001.5)  # after the root's end
    out = fleet.process([_tool(0), _root(), skewed, _tool(1, tid=other)], now=5.0)
    (row,) = out.ended_runs
    assert row.trace_id == TID and row.tool_calls == 1
    assert out.late_spans == 1
    assert [r.trace_id for r in out.routine.runs] == [other]


def test_the_memory_of_ended_runs_is_bounded_in_count_and_in_time() -> None:
    fleet = Fleet(reorder_s=0, max_traces=3, idle_ttl_s=60)
    tids = [f"{i:032x}" for i in range(1, 6)]
    for t, tid in enumerate(tids):
        fleet.process([_tool(0, tid=tid), _root(tid=tid)], now=1.0 + t)
    assert len(fleet._ended) == 3
    # The oldest were forgotten first: a late span of the first run is a new run, of the last is late.
    assert fleet.process([_late_tool(1, tid=tids[-1])], now=7.0).late_spans == 1
    assert fleet.process([_late_tool(1, tid=tids[0])], now=7.0).late_spans == 0
    fleet.process([], now=7.0 + 61)
    assert len(fleet._ended) == 0


def test_a_run_that_went_quiet_and_comes_back_goes_on_counting_and_its_root_writes_its_end() -> None:
    # Waiting for a person longer than the idle TTL is not the end of the run: when it comes
    # back, its calls are numbered on (not from 1 again, over the first calls' rows) and its
    # root span's end is the receipt, not the "went quiet" one.
    fleet = Fleet(reorder_s=0, idle_ttl_s=300)
    fleet.process([_tool(i, args={"q": i}, result=str(i)) for i in range(3)], now=1.0)
    quiet = fleet.process([], now=302.0).ended_runs[0]
    assert quiet.tool_calls == 3 and quiet.receipt is not None and quiet.receipt["end"] is None
    back = fleet.process([_tool(i, args={"q": i}, result=str(i)) for i in range(3, 5)], now=900.0)
    assert [c.call_index for c in back.routine.calls] == [4, 5]
    (end,) = fleet.process([_root()], now=901.0).ended_runs
    assert (end.agent, end.tool_calls, end.receipt is not None and end.receipt["reason"]) == ("looper", 5, "completed")


def test_a_root_span_alone_after_the_run_went_quiet_writes_the_runs_real_end() -> None:
    fleet = Fleet(reorder_s=0, idle_ttl_s=300)
    fleet.process([_tool(0), _tool(1)], now=1.0)
    assert fleet.process([], now=302.0).ended_runs[0].health == "uncertain"
    (end,) = fleet.process([_root(error=True)], now=1000.0).ended_runs
    assert (end.tool_calls, end.health) == (2, "failed")
    assert fleet.process([_late_tool(9)], now=1001.0).late_spans == 1  # ended by its root now
