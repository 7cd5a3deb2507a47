"""The rule table: one sentence per rule for verdicts and exceptions, limits read by name."""

from __future__ import annotations

import pytest

from tripwire.core.events import ToolCall
from tripwire.core.policy import DEFAULT_POLICY, SEED_POLICY, LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.rules import NEVER, RETRY_OF_NON_RETRYABLE, RULES, TripLimits, rule_entry
from tripwire.core.signature import DEFAULT_NORMALIZER, EMPTY_RESULT
from tripwire.core.watch import Assessment, RunState, evaluate


def run(policy: LoopPolicy, calls: list[ToolCall]) -> Assessment:
    state = RunState.new(policy)
    for call in calls:
        evaluate(state, call, policy, DEFAULT_NORMALIZER)
    assert state.current is not None
    return state.current


def test_every_rule_of_the_enum_has_an_entry() -> None:
    assert {e.rule for e in RULES} | {RETRY_OF_NON_RETRYABLE.rule} == set(Rule)


def test_limits_are_read_from_the_policy_by_name() -> None:
    policy = LoopPolicy(
        window=20, threshold=5, min_repeats=4, same_error=3, same_result=9, revisit=7,
        revisit_share=0.5, failure_share=0.25,
    )
    assert policy.trip_limits == TripLimits(
        threshold=5, min_repeats=4, same_error=3, same_result=9, revisit=7,
        revisit_share=10, failure_share=5,  # 0.5 and 0.25 of a window of 20
        mute_failures=4,
    )
    # Rules that are off never trip.
    assert SEED_POLICY.trip_limits == TripLimits(
        threshold=4, min_repeats=NEVER, same_error=NEVER, same_result=NEVER, revisit=NEVER,
        revisit_share=NEVER, failure_share=NEVER, mute_failures=NEVER,
    )
    for entry in RULES:
        assert hasattr(DEFAULT_POLICY, entry.limit), entry


def repeated(n: int, **fields: object) -> list[ToolCall]:
    return [ToolCall(tool="search_docs", arguments={"q": "refund"}, **fields) for _ in range(n)]  # type: ignore[arg-type]


# One run per table entry that trips exactly that entry, under a policy where it decides.
TRIPPING = {
    "threshold": (LoopPolicy(), repeated(4)),
    "min_repeats": (
        LoopPolicy(),
        [ToolCall(tool=t, arguments={"n": t}) for t in "ABABAB"],
    ),
    "same_error": (
        LoopPolicy(failure_share=None),
        [ToolCall(tool=f"t{i}", arguments={"i": i}, error_type="boom") for i in range(5)],
    ),
    "same_result": (
        LoopPolicy(revisit=None, revisit_share=None),
        [ToolCall(tool="grep", arguments={"i": i}, result_digest=EMPTY_RESULT) for i in range(8)],
    ),
    "revisit": (
        LoopPolicy(window=20, threshold=20, max_period=None, same_result=None, revisit_share=None),
        # six calls, then the same six out of order (an in-order replay would be a batch done again)
        [ToolCall(tool=f"t{i}", arguments={"i": i}, result_digest=f"r{i}") for i in (*range(6), 5, 3, 1, 4, 2, 0)],
    ),
    "revisit_share": (
        LoopPolicy(threshold=10, max_period=None, same_result=None, revisit=None),
        [
            ToolCall(tool=f"t{i}", arguments={"i": i}, result_digest=f"r{i}")
            for i in (*range(9), 8, 6, 4, 2, 0, 7, 5, 3, 1)
        ],
    ),
    "failure_share": (
        LoopPolicy(same_error=None),
        [ToolCall(tool=f"t{i}", arguments={"i": i}, error_type=f"e{i}") for i in range(8)],
    ),
    "mute_failures": (
        LoopPolicy(),
        # four different commands not found, each after a call that worked
        [
            call
            for i in range(4)
            for call in (
                ToolCall(tool=f"cmd{i}", arguments={"i": i}, error_type="command_not_found", result_digest=EMPTY_RESULT),
                ToolCall(tool="open", arguments={"f": i}, result_digest=f"file {i}"),
            )
        ][:-1],
    ),
}


def test_every_entry_has_a_tripping_run() -> None:
    assert set(TRIPPING) == {e.limit for e in RULES}


@pytest.mark.parametrize("limit", sorted(TRIPPING))
def test_the_verdict_and_the_exception_share_the_sentence(limit: str) -> None:
    policy, calls = TRIPPING[limit]
    current = run(policy, calls)
    entry = rule_entry(current.rule or Rule.REPETITION, limit)
    assert (current.verdict, current.limit, entry.limit) == (Verdict.STUCK, limit, limit)
    sentence = entry.describe(
        tool=current.tool or "", hits=current.hits, window=current.window, period=current.period or 1
    )
    assert current.reason == f"{sentence} with no new evidence"
    message = str(current.exception())
    advice = entry.advice(current.tool or "")
    assert message.endswith(f"(tripped at call {current.call_index}); {advice}")
    # The message is the sentence with the signature prefix where the sentence has a slot.
    with_sig = entry.describe(
        tool=current.tool or "", hits=current.hits, window=current.window,
        period=current.period or 1, sig=f" (sig {(current.digest or '')[:8]}…)",
    )
    assert message.startswith(with_sig)
    assert "refund" not in message


def test_retry_of_non_retryable_reason_and_message_share_the_sentence() -> None:
    policy = LoopPolicy()
    first = ToolCall(tool="charge", arguments={"card": 1}, error_type="card_declined", retryable=False)
    again = ToolCall(tool="charge", arguments={"card": 1})
    current = run(policy, [first, again])
    assert current.rule is Rule.RETRY_OF_NON_RETRYABLE
    assert current.reason == (
        "charge was called again with identical arguments after it failed with an error "
        "(card_declined) marked non-retryable"
    )
    assert str(current.exception()) == (
        f"charge was called again with identical arguments (sig {current.digest[:8]}…) after it "  # type: ignore[index]
        "failed with an error marked non-retryable (tripped at call 2); change the arguments or "
        "report the failure instead of retrying"
    )


def test_the_two_revisit_entries_keep_their_own_sentence_in_the_exception() -> None:
    for limit, opening in (("revisit", "6 consecutive calls"), ("revisit_share", "9 of the last 10 calls")):
        policy, calls = TRIPPING[limit]
        current = run(policy, calls)  # the revisit_share run trips at 8 and is still tripping at 9
        assert current.rule is Rule.REVISIT
        assert str(current.exception()).startswith(opening), limit
        assert f"LoopPolicy({limit}=...)" in str(current.exception())


def test_only_the_first_entry_of_a_group_counts() -> None:
    # A B A B A B A B: A four times in ten (repetition) and a cycle of two (period): one group,
    # so the repetition rule alone is recorded.
    current = run(LoopPolicy(), [ToolCall(tool=t, arguments={"n": t}) for t in "ABABABA"])
    assert (current.rule, current.limit, current.hits) == (Rule.REPETITION, "threshold", 4)


# -- a check run between changes (p3) ----------------------------------------------------------


def _check_run(
    between: list[tuple[str, str, str | None]],
    check_result: str = "FAILED test_x: 3 != 4",
    check_error: str | None = None,
) -> list[ToolCall]:
    """``pytest`` four times, each time after the calls ``between[i]`` (tool, argument, error)."""
    calls: list[ToolCall] = []
    digest = DEFAULT_NORMALIZER.result_digest(check_result)
    for i in range(4):
        if i:
            tool, arg, error = between[i - 1]
            calls.append(
                ToolCall(
                    tool=tool,
                    arguments={"a": arg},
                    result_digest=DEFAULT_NORMALIZER.result_digest(f"done {arg}"),
                    error_type=error,
                )
            )
        calls.append(ToolCall(tool="pytest", arguments={"k": "x"}, result_digest=digest, error_type=check_error))
    return calls


def test_a_check_rerun_after_a_different_edit_each_time_is_working() -> None:
    got = run(DEFAULT_POLICY, _check_run([("edit", "one", None), ("edit", "two", None), ("edit", "three", None)]))
    assert got.verdict is Verdict.WORKING
    assert got.rule is Rule.REPETITION and "check between changes" in got.reason


def test_a_check_rerun_back_to_back_or_after_the_same_edit_is_stuck() -> None:
    back_to_back = [
        ToolCall(tool="pytest", arguments={"k": "x"}, result_digest=DEFAULT_NORMALIZER.result_digest("FAILED"))
        for _ in range(4)
    ]
    assert run(DEFAULT_POLICY, back_to_back).verdict is Verdict.STUCK
    # the same edit twice in the window is not new: the gap it fills has no call made once
    same_edit = _check_run([("edit", "one", None), ("edit", "one", None), ("edit", "two", None)])
    assert run(DEFAULT_POLICY, same_edit).verdict is Verdict.STUCK


def test_a_check_after_failed_changes_or_one_that_found_nothing_is_stuck() -> None:
    failed_edits = _check_run([("edit", "one", "edit_rejected"), ("edit", "two", None), ("edit", "three", None)])
    assert run(DEFAULT_POLICY.evolve(same_error=None, failure_share=None), failed_edits).verdict is Verdict.STUCK
    missing = _check_run(
        [("edit", "one", None), ("edit", "two", None), ("edit", "three", None)],
        check_result="/bin/bash: line 3: javac: command not found",
        check_error="command_not_found",
    )
    assert DEFAULT_NORMALIZER.result_digest("/bin/bash: line 3: javac: command not found") == EMPTY_RESULT
    got = run(DEFAULT_POLICY, missing)
    assert (got.verdict, got.rule, got.call_index) == (Verdict.STUCK, Rule.REPETITION, 7)


def test_a_check_that_prints_nothing_is_still_a_check() -> None:
    # A script that succeeds silently, rerun after each of three different edits: working.
    edits = [("edit", "one", None), ("edit", "two", None), ("edit", "three", None)]
    for silent in ("", None):
        got = run(DEFAULT_POLICY, _check_run(edits, check_result=silent))  # type: ignore[arg-type]
        assert got.verdict is Verdict.WORKING, silent
        assert got.rule is Rule.REPETITION and "check between changes" in got.reason
    # The same silent check back to back, or after the same edit again, is still stuck at the 4th.
    silent_back_to_back = [
        ToolCall(tool="pytest", arguments={"k": "x"}, result_digest=DEFAULT_NORMALIZER.result_digest(""))
        for _ in range(4)
    ]
    got = run(DEFAULT_POLICY, silent_back_to_back)
    assert (got.verdict, got.call_index) == (Verdict.STUCK, 4)
    same_edit = _check_run([("edit", "one", None), ("edit", "one", None), ("edit", "two", None)], check_result="")
    assert run(DEFAULT_POLICY, same_edit).verdict is Verdict.STUCK


def test_the_seed_rule_keeps_no_evidence_for_checks() -> None:
    checks = _check_run([("edit", "one", None), ("edit", "two", None), ("edit", "three", None)])
    assert run(SEED_POLICY, checks).verdict is Verdict.STUCK


# -- failures with nothing to say (mute_failures) -------------------------------------------------


def _mute(tool: str, i: int) -> ToolCall:
    return ToolCall(tool=tool, arguments={"i": i}, error_type="command_not_found", result_digest=EMPTY_RESULT)


def _ok(i: int) -> ToolCall:
    return ToolCall(tool="open", arguments={"f": i}, result_digest=f"file {i}")


def test_four_failures_with_nothing_to_say_in_twenty_calls_are_stuck_whatever_the_tools() -> None:
    calls: list[ToolCall] = []
    for i, tool in enumerate(("javac", "mvn", "gradle", "ant")):
        calls += [_mute(tool, i), _ok(3 * i), _ok(3 * i + 1), _ok(3 * i + 2)]
    policy = LoopPolicy()
    state = RunState.new(policy)
    verdicts = []
    for call in calls:
        evaluate(state, call, policy, DEFAULT_NORMALIZER)
        assert state.current is not None
        verdicts.append(state.current.verdict)
    # the 4th such failure is call 13: stuck there, working before
    assert verdicts.index(Verdict.STUCK) == 12
    got = run(policy, calls[:13])
    assert (got.rule, got.limit, got.hits, got.tool) == (Rule.FAILURES, "mute_failures", 4, "ant")
    assert got.reason.startswith("4 calls within the last 20, up to ant, failed with nothing to say")


def test_failures_with_nothing_to_say_spread_wider_than_the_span_or_with_output_are_not_counted() -> None:
    policy = LoopPolicy()
    # 4 of them, 7 calls apart: never 4 within 20 calls
    spread: list[ToolCall] = []
    for i in range(4):
        spread += [_mute(f"cmd{i}", i), *(_ok(10 * i + j) for j in range(6))]
    assert run(policy, spread).verdict is Verdict.WORKING
    # failures that say something (a compiler error, a failing test) are not mute: 6 in 12 calls
    said = DEFAULT_NORMALIZER.result_digest("Foo.java:3: error: ';' expected")
    talking: list[ToolCall] = []
    for i in range(6):
        talking += [ToolCall(tool="javac", arguments={"i": i}, error_type="compile_error", result_digest=said), _ok(i)]
    assert run(policy, talking).verdict is Verdict.WORKING
    # an empty result that did not fail is found-nothing, not a failure: 4 in 8 calls
    empty = [c for i in range(4) for c in (ToolCall(tool=f"grep{i}", arguments={"i": i}, result_digest=EMPTY_RESULT), _ok(i))]
    assert run(policy, empty).verdict is Verdict.WORKING
    # off: never
    calls = [c for i in range(6) for c in (_mute(f"cmd{i}", i), _ok(i))]
    assert run(policy, calls).verdict is Verdict.STUCK
    assert run(policy.evolve(mute_failures=None), calls).verdict is Verdict.WORKING
    assert run(SEED_POLICY, calls).verdict is Verdict.WORKING


def test_the_mute_count_follows_the_window_and_is_bounded() -> None:
    # window 5: the span is 10 calls; 3 such failures 4 calls apart fit, 5 apart do not
    policy = LoopPolicy(window=5, threshold=4, mute_failures=3)
    close = [c for i in range(3) for c in (_mute(f"c{i}", i), _ok(3 * i), _ok(3 * i + 1), _ok(3 * i + 2))][:-3]
    assert run(policy, close).verdict is Verdict.STUCK
    far = [c for i in range(3) for c in (_mute(f"c{i}", i), *(_ok(4 * i + j) for j in range(4)))][:-4]
    assert run(policy, far).verdict is Verdict.WORKING
    state = RunState.new(LoopPolicy())
    for i in range(50):
        evaluate(state, _mute(f"c{i}", i), LoopPolicy(failure_share=None, same_error=None), DEFAULT_NORMALIZER)
    assert state.mute_at is not None and len(state.mute_at) == 4  # never more than the count


def test_a_guard_stops_the_run_at_the_fourth_command_not_found() -> None:
    from tripwire import Guard, Limits, LoopDetected, ToolResult

    guard = Guard(Limits(), loop_policy=LoopPolicy())
    bodies_run: list[str] = []
    plan = [("create", "x"), ("javac", "a"), ("open", "b"), ("mvn", "c"), ("open", "d"), ("gradle", "e"),
            ("ls", "f"), ("java", "g"), ("open", "h"), ("edit", "i")]
    missing = {"javac", "mvn", "gradle", "java"}
    with pytest.raises(LoopDetected) as caught:
        for tool, arg in plan:
            guard.before_tool(tool, {"command": f"{tool} {arg}"})
            bodies_run.append(tool)
            if tool in missing:
                result = ToolResult.error("command_not_found", value=f"/bin/bash: line 1: {tool}: command not found")
            else:
                result = ToolResult.success(f"did {tool} {arg}")
            guard.after_tool(tool, {"command": f"{tool} {arg}"}, result)
    assert caught.value.rule is Rule.FAILURES and caught.value.call_index == 8
    # stopped right after the 4th command not found ran: nothing after it
    assert bodies_run == ["create", "javac", "open", "mvn", "open", "gradle", "ls", "java"]
