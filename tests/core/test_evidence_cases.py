"""Issue 15's evidence cases through the public API: ``LoopWatcher`` and ``Guard``, defaults only
(plus the declared poll where the case declares one)."""

from __future__ import annotations

import pytest

from evidence_cases import Case, cases, replay_case
from tripwire import (
    Guard,
    Limits,
    LoopDetected,
    LoopPolicy,
    LoopWatcher,
    Rule,
    ToolCall,
    ToolResult,
    Verdict,
)
from tripwire.core.policy import Poll
from tripwire.core.signature import DEFAULT_NORMALIZER

CASES = cases()


def _policy(case: Case) -> LoopPolicy:
    if not case.polls:
        return LoopPolicy()
    return LoopPolicy(polls={t: Poll(interval_s=i, max_wait_s=w) for t, (i, w) in case.polls.items()})


def _verdicts(case: Case) -> tuple[list[Verdict], list[str]]:
    judged = replay_case(case)
    return [Verdict(v) for v, _ in judged], [r for _, r in judged]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_loop_watcher_judges_the_case_as_the_issue_says(case: Case) -> None:
    verdicts, reasons = _verdicts(case)
    stuck = [i for i, v in enumerate(verdicts, 1) if v is Verdict.STUCK]
    assert (stuck[0] if stuck else None) == case.stuck_at, verdicts
    waiting = tuple(i for i, v in enumerate(verdicts, 1) if v is Verdict.WAITING)
    assert waiting == case.waiting
    if case.stuck_at is None:
        assert set(verdicts) <= {Verdict.WORKING, Verdict.WAITING}
    else:
        assert all(v is not Verdict.STUCK for v in verdicts[: case.stuck_at - 1])
        for phrase in case.reason_has:
            assert phrase in reasons[case.stuck_at - 1]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_guard_stops_the_run_exactly_where_the_case_is_stuck(case: Case) -> None:
    clock = _Clock()
    guard = Guard(Limits(), loop_policy=_policy(case), clock=clock)
    bodies_run = 0
    stopped_at: int | None = None
    waiting: list[int] = []
    for index, step in enumerate(case.steps, 1):
        clock.now = step.at
        try:
            guard.before_tool(step.tool, step.args)
            bodies_run += 1  # the tool body runs only after before_tool let it
            result = (
                ToolResult.success(step.result)
                if step.error is None
                else ToolResult.error(step.error, value=step.result)
            )
            assessment = guard.after_tool(step.tool, step.args, result, start_s=step.at, end_s=step.at + 0.1)
        except LoopDetected as exc:
            stopped_at = index
            assert exc.call_index == index
            break
        if assessment is not None and assessment.verdict is Verdict.WAITING:
            waiting.append(index)
    assert stopped_at == case.stuck_at
    if case.stuck_at is None:
        assert bodies_run == len(case.steps)
    else:
        # Refused before its body ran, or stopped right after it: never a call beyond it.
        assert bodies_run in (case.stuck_at - 1, case.stuck_at)
    if case.waiting:
        assert waiting and waiting[0] == case.waiting[0]


def test_a_changing_error_message_is_evidence_under_the_repetition_rule() -> None:
    # Decided on the recorded runs: the same test command run between edits fails each time
    # with a different output; counting that as "no evidence" flagged 18 more healthy runs of
    # 356 for 2 more runaways (README, "How well it works").
    # Four identical failing commands with a changing error stay working; the 5th failure with
    # the same error class in a row trips same_error, whatever the output.
    watcher = LoopWatcher()
    for i in range(5):
        watcher.observe(
            ToolCall(
                tool="pytest",
                arguments={"command": "pytest tests/test_refund.py"},
                error_type="test_failure",
                result_digest=DEFAULT_NORMALIZER.result_digest(f"FAILED test_refund_{'abcdef'[i]} - AssertionError"),
            )
        )
        assert watcher.verdict is (Verdict.WORKING if i < 4 else Verdict.STUCK)
    assert watcher.current is not None and watcher.current.rule is Rule.SAME_ERROR
    # ... and the same failure with the same output again is no evidence at all.
    same = LoopWatcher()
    for _ in range(4):
        same.observe(
            ToolCall(tool="pytest", arguments={"command": "pytest"}, error_type="test_failure",
                     result_digest=DEFAULT_NORMALIZER.result_digest("FAILED test_refund - AssertionError"))
        )
    assert same.verdict is Verdict.STUCK


def test_a_declared_poll_without_call_times_counts_its_polls() -> None:
    # max_wait_s / interval_s = 6 polls after the first: calls 4..7 waiting, call 8 stuck.
    watcher = LoopWatcher(LoopPolicy(polls={"job_status": Poll(interval_s=10, max_wait_s=60)}))
    verdicts = []
    for _ in range(9):
        watcher.observe(ToolCall(tool="job_status", arguments={"job": 7},
                                 result_digest=DEFAULT_NORMALIZER.result_digest("pending")))
        verdicts.append(watcher.verdict)
    assert verdicts.index(Verdict.WAITING) == 3
    assert verdicts.index(Verdict.STUCK) == 7


def test_a_declared_poll_whose_result_changes_is_working() -> None:
    watcher = LoopWatcher(LoopPolicy(polls={"job_status": Poll(interval_s=1, max_wait_s=2)}))
    for i in range(12):
        watcher.observe(ToolCall(tool="job_status", arguments={"job": 7}, start_s=float(i),
                                 result_digest=DEFAULT_NORMALIZER.result_digest(f"{i} of 12 done")))
        assert watcher.verdict is Verdict.WORKING


@pytest.mark.parametrize("bad", [0, -1, float("inf"), True, "5"])
def test_poll_rejects_a_bad_duration(bad: object) -> None:
    from tripwire import ConfigError

    with pytest.raises(ConfigError) as info:
        Poll(interval_s=bad, max_wait_s=60)  # type: ignore[arg-type]
    assert info.value.field == "Poll.interval_s"
    with pytest.raises(ConfigError) as info:
        LoopPolicy(polls={"job_status": {"interval_s": 1}})  # type: ignore[dict-item]
    assert info.value.field == "polls['job_status']"


def test_a_poll_is_declared_in_the_policy_file() -> None:
    from tripwire import ConfigError
    from tripwire.replay.policyfile import parse_policy

    got = parse_policy({"version": 1, "policy": {"polls": {"job_status": {"interval_s": 10, "max_wait_s": 600}}}})
    assert got.policy.polls == {"job_status": Poll(interval_s=10, max_wait_s=600)}
    assert got.policy.version != LoopPolicy().version
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "policy": {"polls": {"job_status": {"interval_s": 10}}}})
    assert info.value.field == "policy.polls.job_status.max_wait_s"
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "policy": {"polls": {"job_status": {"interval_s": 0, "max_wait_s": 5}}}})
    assert info.value.field == "policy.polls.job_status.interval_s"
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "policy": {"polls": {"job_status": {"interval": 1, "max_wait_s": 5}}}})
    assert info.value.field == "policy.polls.job_status.interval"


def test_the_table_check_used_by_the_quality_bench_holds_the_defaults_and_has_teeth() -> None:
    from evidence_cases import table_holds

    def verdicts(policy: LoopPolicy, case: Case) -> list[str]:
        return [v for v, _ in replay_case(case, policy)]

    assert all(table_holds(verdicts(LoopPolicy(), case), case) for case in CASES)
    # "stuck at the 4th call": a threshold of 3 or 5 breaks the table; no same_result rule does too
    for bad in ({"threshold": 3}, {"threshold": 5}, {"same_result": None}):
        assert not all(table_holds(verdicts(LoopPolicy(**bad), case), case) for case in CASES), bad
