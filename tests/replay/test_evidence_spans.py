"""Issue 15's evidence cases through replayed OTLP spans: the same verdicts as through the
public API (``tests/core/test_evidence_cases.py``), from the traces an exporter writes."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_otlp import agent_span, dumps, request, tool_span

from evidence_cases import Case, cases
from tripwire.core.policy import LoopPolicy, Poll
from tripwire.core.reasons import Verdict
from tripwire.core.watch import RunState, evaluate
from tripwire.replay.engine import load_traces, replay_trace

CASES = cases()


def _policy(case: Case) -> LoopPolicy:
    if not case.polls:
        return LoopPolicy()
    return LoopPolicy(polls={t: Poll(interval_s=i, max_wait_s=w) for t, (i, w) in case.polls.items()})


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_replayed_spans_are_judged_as_the_issue_says(case: Case, tmp_path: Path) -> None:
    spans = [agent_span(1, 1, "agent")]
    spans += [
        tool_span(
            1, 100 + i, step.tool, step.args, at=int(step.at) + 1, result=step.result, call_id=f"call_{i}",
            error=step.error,
        )
        for i, step in enumerate(case.steps)
    ]
    path = tmp_path / "trace.json"
    path.write_text(dumps(request(spans)))
    loaded = load_traces(path)
    assert not loaded.problems
    [trace] = loaded.traces
    assert len(trace.calls) == len(case.steps)
    policy = _policy(case)

    first = replay_trace(trace, policy).first_trip
    assert (first.call_index if first is not None else None) == case.stuck_at

    state = RunState.new(policy)
    verdicts = []
    for call, sig in zip(trace.calls, trace.signatures, strict=True):
        evaluate(state, call, policy, trace.normalizer, signature=sig)
        assert state.current is not None
        verdicts.append(state.current.verdict)
    assert tuple(i for i, v in enumerate(verdicts, 1) if v is Verdict.WAITING) == case.waiting
    if case.stuck_at is not None:
        reason = ""
        state = RunState.new(policy)
        for call, sig in list(zip(trace.calls, trace.signatures, strict=True))[: case.stuck_at]:
            evaluate(state, call, policy, trace.normalizer, signature=sig)
            reason = state.current.reason if state.current is not None else ""
        for phrase in case.reason_has:
            assert phrase in reason
