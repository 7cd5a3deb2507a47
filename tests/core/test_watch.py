"""The watcher core: repetition and period rules, the verdict order, stickiness, hysteresis.

Expected values are worked out by hand from the rules in issue 2 §2 (see each test's comment),
never read back from the code under test.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy, RetryPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, EMPTY_RESULT, Normalizer, signature_of
from tripwire.core.watch import Assessment, RunState, evaluate
from tripwire.testing import deep_sizeof, make_calls

# The rules exactly as issue 2 states them (period 2..3, no calibrated extras), next to the
# shipped defaults: the issue's scenarios must hold under both.
ISSUE = LoopPolicy(
    name="issue2",
    max_period=3,
    same_error=None,
    revisit=None,
    revisit_share=None,
    failure_share=None,
    result_evidence="polling",  # type: ignore[arg-type]
)
BOTH = pytest.mark.parametrize("policy", [ISSUE, DEFAULT_POLICY], ids=["issue2", "default"])


class Run:
    """Feeds calls through ``evaluate`` and records what each call returned."""

    def __init__(self, policy: LoopPolicy = ISSUE, normalizer: Normalizer = DEFAULT_NORMALIZER) -> None:
        self.policy = policy
        self.normalizer = normalizer
        self.state = RunState.new(policy)
        self.events: list[Assessment | None] = []
        self.trips: list[tuple[int, Rule]] = []
        """(1-based call index, rule) of every call at which a rule tripped and was recorded."""

    def feed(self, calls: Iterable[ToolCall], now_s: float | None = None) -> Run:
        for call in calls:
            event = evaluate(self.state, call, self.policy, self.normalizer, now_s=now_s)
            self.events.append(event)
            cur = self.state.current
            if cur is not None and cur.call_index == self.state.calls and cur.rule is not None:
                self.trips.append((cur.call_index, cur.rule))
        return self

    def one(self, tool: str, arguments: Any = None, **fields: Any) -> Assessment | None:
        self.feed([ToolCall(tool=tool, arguments=arguments, **fields)])
        return self.events[-1]

    @property
    def current(self) -> Assessment:
        assert self.state.current is not None
        return self.state.current

    @property
    def verdict(self) -> Verdict:
        return self.current.verdict

    def changes(self) -> list[tuple[int, Verdict]]:
        return [(i, e.verdict) for i, e in enumerate(self.events, 1) if e is not None]


def fillers(n: int, start: int = 0) -> list[ToolCall]:
    return [ToolCall(tool=f"filler_{i}", arguments={"i": i}) for i in range(start, start + n)]


def x_call(**fields: Any) -> ToolCall:
    return ToolCall(tool="search_docs", arguments={"query": "refund policy"}, **fields)


# -- repetition rule ---------------------------------------------------------------------------


@BOTH
def test_four_identical_calls_trip_at_the_fourth(policy: LoopPolicy) -> None:
    run = Run(policy).feed([x_call() for _ in range(3)])
    assert run.verdict is Verdict.WORKING  # threshold - 1 identical calls: activity
    assert run.trips == []
    event = run.one("search_docs", {"query": "refund policy"})
    assert event is not None
    assert event.verdict is Verdict.STUCK
    assert event.rule is Rule.REPETITION
    assert (event.tool, event.hits, event.period, event.window, event.call_index) == (
        "search_docs", 4, 1, 10, 4,
    )
    assert event.digest == signature_of("search_docs", {"query": "refund policy"}).digest
    assert event.policy_version == policy.version
    assert event.normalizer_version == DEFAULT_NORMALIZER.version
    assert "refund" not in event.reason  # digests, never raw arguments


@BOTH
def test_eighty_distinct_calls_never_trip(policy: LoopPolicy) -> None:
    run = Run(policy).feed(
        ToolCall(tool=("search", "read", "summarize")[i % 3], arguments={"doc": i}) for i in range(80)
    )
    assert run.trips == []
    assert run.changes() == [(1, Verdict.WORKING)]
    assert run.verdict is Verdict.WORKING


def test_fourth_identical_call_as_the_tenth_call_is_inside_the_window() -> None:
    # X at calls 1, 2, 3 and 10: the last 10 calls (1..10) hold four X.
    run = Run().feed([x_call(), x_call(), x_call(), *fillers(6), x_call()])
    assert run.trips == [(10, Rule.REPETITION)]
    assert run.current.hits == 4


def test_fourth_identical_call_as_the_eleventh_call_is_outside_the_window() -> None:
    # X at calls 1, 2, 3 and 11: the last 10 calls (2..11) hold three X.
    run = Run().feed([x_call(), x_call(), x_call(), *fillers(7), x_call()])
    assert run.trips == []
    assert run.verdict is Verdict.WORKING


def test_spread_out_repeats_count_within_the_window() -> None:
    # X at calls 1, 4, 7, 10.
    calls = [x_call(), *fillers(2, 0), x_call(), *fillers(2, 2), x_call(), *fillers(2, 4), x_call()]
    assert Run().feed(calls).trips == [(10, Rule.REPETITION)]


def test_threshold_equal_to_window() -> None:
    policy = LoopPolicy(window=5, threshold=5, max_period=None)
    run = Run(policy).feed([x_call() for _ in range(4)])
    assert run.trips == []
    run.feed([x_call()])
    assert run.trips == [(5, Rule.REPETITION)]


def test_volatile_keys_do_not_hide_a_repetition() -> None:
    calls = [
        ToolCall(tool="search_docs", arguments={"query": "refund policy", "request_id": f"r{i}", "timestamp": i})
        for i in range(4)
    ]
    assert Run().feed(calls).trips == [(4, Rule.REPETITION)]


def test_json_string_and_dict_arguments_are_the_same_action() -> None:
    calls = [
        ToolCall(tool="search_docs", arguments='{"query": "refund policy"}'),
        ToolCall(tool="search_docs", arguments={"query": "refund policy"}),
        ToolCall(tool="search_docs", arguments='{ "query" : "refund policy" }'),
        ToolCall(tool="search_docs", arguments=b'{"query":"refund policy"}'),
    ]
    assert Run().feed(calls).trips == [(4, Rule.REPETITION)]


def test_same_tool_different_arguments_is_not_a_repetition_unless_key_is_tool() -> None:
    calls = [ToolCall(tool="search_docs", arguments={"query": f"q{i}"}) for i in range(4)]
    assert Run().feed(calls).trips == []
    by_tool = Run(ISSUE.evolve(key="tool")).feed(calls)
    assert by_tool.trips == [(4, Rule.REPETITION)]
    assert by_tool.verdict is Verdict.STUCK


def test_a_signature_can_be_passed_in() -> None:
    state = RunState.new(ISSUE)
    sig = signature_of("search_docs", {"query": "refund policy"})
    events = [
        evaluate(state, ToolCall(tool="search_docs"), ISSUE, DEFAULT_NORMALIZER, signature=sig)
        for _ in range(4)
    ]
    assert events[3] is not None and events[3].verdict is Verdict.STUCK
    assert events[3].arguments_seen  # the precomputed signature has arguments


# -- period rule -------------------------------------------------------------------------------


@BOTH
def test_search_read_three_times_trips_at_call_six_with_period_two(policy: LoopPolicy) -> None:
    calls = make_calls(["search", "read"] * 3)
    run = Run(policy).feed(calls[:5])
    assert run.trips == []
    run.feed(calls[5:])
    assert run.trips == [(6, Rule.PERIOD)]
    assert run.verdict is Verdict.STUCK
    assert (run.current.period, run.current.hits, run.current.tool) == (2, 3, "read")


@BOTH
def test_abc_three_times_trips_at_call_nine_with_period_three(policy: LoopPolicy) -> None:
    calls = make_calls("ABC" * 3)
    run = Run(policy).feed(calls[:8])
    assert run.trips == []
    run.feed(calls[8:])
    assert run.trips == [(9, Rule.PERIOD)]
    assert (run.current.period, run.current.hits) == (3, 3)


@BOTH
def test_abab_c_abab_never_trips_the_period_rule(policy: LoopPolicy) -> None:
    calls = make_calls("A B A B C A B A B")
    # With the default threshold the repetition rule legitimately trips: A's 4th occurrence is
    # call 8 (A at 1, 3, 6, 8) and B's is call 9 (B at 2, 4, 7, 9).
    assert Run(policy).feed(calls).trips == [(8, Rule.REPETITION), (9, Rule.REPETITION)]
    # With repetition out of the way, nothing trips at all.
    assert Run(policy.evolve(threshold=10)).feed(calls).trips == []


def test_aab_cycle_trips_period_three() -> None:
    calls = make_calls("AAB" * 3)
    assert Run(ISSUE.evolve(threshold=10)).feed(calls).trips == [(9, Rule.PERIOD)]


def test_a_single_repeated_call_is_not_a_period() -> None:
    # Period 1 is the repetition rule's job: "A" x 10 under threshold 10 trips only at call 10,
    # and only as a repetition.
    run = Run(ISSUE.evolve(threshold=10)).feed(make_calls("A" * 10))
    assert run.trips == [(10, Rule.REPETITION)]


def test_min_repeats_two() -> None:
    run = Run(ISSUE.evolve(min_repeats=2, threshold=10)).feed(make_calls("ABAB"))
    assert run.trips == [(4, Rule.PERIOD)]
    assert (run.current.period, run.current.hits) == (2, 2)


def test_max_period_bounds_the_cycle_length() -> None:
    calls = make_calls("ABC" * 3)
    assert Run(ISSUE.evolve(max_period=2)).feed(calls).trips == []


def test_period_rule_off() -> None:
    calls = make_calls("AB" * 4)
    assert Run(ISSUE.evolve(max_period=None, threshold=10)).feed(calls).trips == []


def test_period_rule_under_tool_key() -> None:
    calls = [ToolCall(tool=("search", "read")[i % 2], arguments={"n": i}) for i in range(6)]
    assert Run(ISSUE).feed(calls).trips == []
    assert Run(ISSUE.evolve(key="tool")).feed(calls).trips == [(6, Rule.PERIOD)]


# -- events, stickiness, hysteresis ------------------------------------------------------------


def test_events_only_on_verdict_change() -> None:
    run = Run().feed([x_call() for _ in range(6)])
    # The first call starts the run's verdict; the next two keep it; the 4th changes it; the
    # 5th and 6th trip again but the verdict holds, so no event.
    assert [e.verdict if e else None for e in run.events] == [
        Verdict.WORKING, None, None, Verdict.STUCK, None, None,
    ]
    assert run.current.call_index == 6  # the verdict in force is refreshed at each trip
    assert run.current.hits == 6


def test_a_loop_verdict_holds_until_a_whole_window_passes_without_a_trip() -> None:
    run = Run().feed([x_call() for _ in range(4)])  # stuck at call 4
    run.feed(fillers(9))  # calls 5..13: fewer than 10 calls since the last trip
    assert run.verdict is Verdict.STUCK
    assert run.events[4:] == [None] * 9
    run.feed(fillers(1, 9))  # call 14: calls 5..14 are a whole window without a trip
    assert run.events[-1] is not None
    assert run.events[-1].verdict is Verdict.WORKING
    assert run.changes() == [(1, Verdict.WORKING), (4, Verdict.STUCK), (14, Verdict.WORKING)]


def test_confirm_two_delays_a_repetition_trip_by_one_evaluation() -> None:
    run = Run(ISSUE.evolve(confirm=2)).feed([x_call() for _ in range(4)])
    assert run.verdict is Verdict.WORKING
    assert run.events[3] is None
    run.feed([x_call()])
    assert run.events[4] is not None
    assert (run.events[4].verdict, run.events[4].call_index) == (Verdict.STUCK, 5)


def test_confirm_needs_consecutive_trips() -> None:
    # Trip at call 4 (1st), a different call breaks the streak, call 6 (X's 5th) trips again
    # (1st of a new streak), call 7 confirms.
    run = Run(ISSUE.evolve(confirm=2)).feed([x_call(), x_call(), x_call(), x_call(), *fillers(1), x_call()])
    assert run.verdict is Verdict.WORKING
    run.feed([x_call()])
    assert run.changes() == [(1, Verdict.WORKING), (7, Verdict.STUCK)]


# -- deterministic failures --------------------------------------------------------------------


def _non_retryable(**fields: Any) -> ToolCall:
    return x_call(error_type="invalid_argument", retryable=False, **fields)


@pytest.mark.parametrize("confirm", [1, 2])
def test_retry_of_a_non_retryable_failure_is_stuck_at_once(confirm: int) -> None:
    policy = ISSUE.evolve(window=10, threshold=10, confirm=confirm)
    run = Run(policy).feed([_non_retryable(), x_call()])
    event = run.events[1]
    assert event is not None
    assert event.verdict is Verdict.STUCK
    assert event.rule is Rule.RETRY_OF_NON_RETRYABLE
    assert (event.call_index, event.hits, event.tool) == (2, 2, "search_docs")


def test_non_retryable_overrides_a_retry_policy_listing_the_error() -> None:
    policy = ISSUE.evolve(retry=RetryPolicy(errors={"invalid_argument"}, max_attempts=5))
    run = Run(policy).feed([_non_retryable(), x_call()])
    assert run.trips == [(2, Rule.RETRY_OF_NON_RETRYABLE)]


def test_non_retryable_failure_does_not_block_different_arguments() -> None:
    run = Run().feed([_non_retryable(), ToolCall(tool="search_docs", arguments={"query": "refunds"})])
    assert run.trips == []


def test_retryable_failure_repeated_once_is_not_stuck() -> None:
    run = Run().feed([x_call(error_type="timeout", retryable=True), x_call()])
    assert run.trips == []


def test_non_retryable_failure_nine_calls_back_is_still_in_the_window() -> None:
    # Failure at call 1, retry at call 10: the window (calls 1..10) still holds the failure.
    run = Run().feed([_non_retryable(), *fillers(8), x_call()])
    assert run.trips == [(10, Rule.RETRY_OF_NON_RETRYABLE)]


def test_non_retryable_failure_that_left_the_window_is_forgotten() -> None:
    # Failure at call 1, retry at call 12: the window (calls 3..12) no longer holds it.
    run = Run().feed([_non_retryable(), *fillers(10), x_call()])
    assert run.trips == []


def test_non_retryable_failure_exactly_window_calls_back_is_outside() -> None:
    # Failure at call 1, retry at call 11: the window (calls 2..11) no longer holds it.
    run = Run().feed([_non_retryable(), *fillers(9), x_call()])
    assert run.trips == []


def test_non_retryable_failure_that_left_the_window_is_forgotten_under_tool_key() -> None:
    # Same rule under key='tool', whose ring holds tool keys, not argument signatures.
    run = Run(ISSUE.evolve(key="tool")).feed([_non_retryable(), *fillers(20), x_call()])
    assert run.trips == []


def test_same_error_rule_is_off_when_none() -> None:
    calls = [ToolCall(tool="build", arguments={"n": i}, error_type="CompileError") for i in range(12)]
    assert Run(ISSUE).feed(calls).trips == []


def test_same_error_rule_trips_at_its_count() -> None:
    policy = ISSUE.evolve(same_error=3)
    calls = [ToolCall(tool="build", arguments={"n": i}, error_type="CompileError") for i in range(3)]
    run = Run(policy).feed(calls[:2])
    assert run.trips == []
    run.feed(calls[2:])
    assert run.trips == [(3, Rule.SAME_ERROR)]
    assert (run.verdict, run.current.hits) == (Verdict.STUCK, 3)


def test_same_error_run_is_broken_by_another_error_or_a_success() -> None:
    policy = ISSUE.evolve(same_error=3)

    def c(i: int, err: str | None) -> ToolCall:
        return ToolCall(tool="build", arguments={"n": i}, error_type=err)

    run = Run(policy).feed([c(0, "E"), c(1, "F"), c(2, "E"), c(3, "E"), c(4, None), c(5, "E"), c(6, "E")])
    assert run.trips == []
    run.feed([c(7, "E")])
    assert run.trips == [(8, Rule.SAME_ERROR)]


def _tour(n: int, result: str = "same", order: list[int] | None = None) -> list[ToolCall]:
    return [
        ToolCall(tool="open_file", arguments={"path": f"f{i}"}, result_digest=f"{result}{i}")
        for i in (order if order is not None else range(n))
    ]


def test_revisit_rule_catches_a_cycle_longer_than_the_window() -> None:
    # 12 distinct calls, then the same ones again out of order with the same results: calls
    # 13..18 each repeat an earlier (call, result) pair; the 6th in a row (call 18) trips, and
    # the same results again are no evidence.
    policy = DEFAULT_POLICY.evolve(revisit=6)
    shuffled = [11, 3, 7, 0, 9, 5, 1, 10, 2, 8, 4, 6]
    run = Run(policy).feed(_tour(12) + _tour(12, order=shuffled[:5]))
    assert run.trips == []
    run.feed(_tour(12, order=shuffled[5:6]))
    assert run.trips == [(18, Rule.REVISIT)]
    assert (run.verdict, run.current.hits) == (Verdict.STUCK, 6)


def test_a_stretch_done_again_in_order_is_a_revisit_only_the_third_time() -> None:
    # A batch of 12 done twice, in the same order, with the same results (15 writes, each
    # confirmed "done", then the same 15 again) is not a loop: past REPLAY_GRACE calls an
    # in-order replay stops counting. The third time through, it trips at its 6th call.
    policy = DEFAULT_POLICY.evolve(revisit=6, revisit_share=None)
    run = Run(policy).feed(_tour(12) + _tour(12))
    assert run.trips == []
    # (the second round's first REPLAY_GRACE revisits still count: the third round adds three)
    run.feed(_tour(12)[:2])
    assert run.trips == []
    run.feed(_tour(12)[2:3])
    assert run.trips == [(27, Rule.REVISIT)]


def test_revisit_with_new_results_is_not_a_revisit() -> None:
    shuffled = [11, 3, 7, 0, 9, 5, 1, 10, 2, 8, 4, 6]
    run = Run(DEFAULT_POLICY.evolve(revisit=6)).feed(_tour(12) + _tour(12, result="new", order=shuffled))
    assert run.trips == []


def _search(i: int, result: str = EMPTY_RESULT) -> ToolCall:
    return ToolCall(tool="find_file", arguments={"name": f"config{i}.*"}, result_digest=result)


def test_same_result_rule_trips_at_the_sixth_search_that_found_nothing() -> None:
    # Six different searches, none found anything: nothing new is learned. The default is 6.
    run = Run(DEFAULT_POLICY).feed([_search(i) for i in range(5)])
    assert run.trips == []
    run.feed([_search(5)])
    assert run.trips == [(6, Rule.SAME_RESULT)]
    assert (run.verdict, run.current.hits) == (Verdict.STUCK, 6)


def test_same_result_counts_only_results_that_found_nothing() -> None:
    # Thirty lookups of different orders, all "shipped": a batch, not a loop.
    shipped = DEFAULT_NORMALIZER.result_digest("shipped")
    assert Run(DEFAULT_POLICY).feed([_search(i, result=shipped) for i in range(30)]).trips == []


def test_same_result_streak_is_broken_by_another_tool_or_a_new_result() -> None:
    other = ToolCall(tool="open_file", arguments={"path": "a"}, result_digest="text")
    calls = [_search(i) for i in range(5)] + [other] + [_search(i) for i in range(5, 10)]
    assert Run(DEFAULT_POLICY).feed(calls).trips == []
    fresh = [_search(i, result=f"found {chr(97 + i)}") for i in range(12)]
    assert Run(DEFAULT_POLICY).feed(fresh).trips == []


def test_same_result_needs_recorded_results_and_can_be_switched_off() -> None:
    no_results = [ToolCall(tool="find_file", arguments={"name": f"c{i}"}) for i in range(12)]
    assert Run(DEFAULT_POLICY).feed(no_results).trips == []
    off = DEFAULT_POLICY.evolve(same_result=None)
    assert Run(off).feed([_search(i) for i in range(12)]).trips == []


# -- 1. leases ---------------------------------------------------------------------------------


def _poll(t: float, lease: Lease | None = None, **fields: Any) -> ToolCall:
    return ToolCall(
        tool="check_approval", arguments={"ticket": 7}, start_s=t - 0.1, end_s=t, lease=lease, **fields
    )


def test_valid_lease_is_waiting() -> None:
    lease = Lease(owner="alice", deadline_s=100.0)
    run = Run().feed([_poll(t, lease) for t in (1, 2, 3, 4)])
    assert run.trips == [(4, Rule.REPETITION)]
    assert run.verdict is Verdict.WAITING
    assert "alice" in run.current.reason


def test_expired_lease_is_decided_from_the_rest() -> None:
    # Deadline 3.5: at the tripping call (t=4) the lease is over, nothing else explains it.
    lease = Lease(owner="alice", deadline_s=3.5)
    assert Run().feed([_poll(t, lease) for t in (1, 2, 3, 4)]).verdict is Verdict.STUCK


def test_lease_at_its_deadline_is_expired() -> None:
    lease = Lease(owner="alice", deadline_s=4.0)
    assert Run().feed([_poll(t, lease) for t in (1, 2, 3, 4)]).verdict is Verdict.STUCK


def test_lease_expiring_mid_loop_turns_waiting_into_stuck() -> None:
    lease = Lease(owner="alice", deadline_s=4.5)
    run = Run().feed([_poll(t, lease) for t in (1, 2, 3, 4, 5)])
    assert run.changes() == [(1, Verdict.WORKING), (4, Verdict.WAITING), (5, Verdict.STUCK)]


def test_expired_lease_falls_through_to_the_retry_policy() -> None:
    lease = Lease(owner="alice", deadline_s=0.5)
    policy = ISSUE.evolve(retry=RetryPolicy(errors={"pending"}, max_attempts=10))
    run = Run(policy).feed([_poll(t, lease, error_type="pending") for t in (1, 2, 3, 4)])
    assert run.verdict is Verdict.RETRYING


def test_lease_renewals_up_to_the_limit() -> None:
    ok = Lease(owner="alice", deadline_s=100.0, renewals=3)
    over = Lease(owner="alice", deadline_s=100.0, renewals=4)
    assert Run().feed([_poll(t, ok) for t in (1, 2, 3, 4)]).verdict is Verdict.WAITING
    assert Run().feed([_poll(t, over) for t in (1, 2, 3, 4)]).verdict is Verdict.STUCK
    strict = ISSUE.evolve(max_lease_renewals=0)
    once = Lease(owner="alice", deadline_s=100.0, renewals=1)
    assert Run(strict).feed([_poll(t, once) for t in (1, 2, 3, 4)]).verdict is Verdict.STUCK


def test_lease_without_owner_is_ignored() -> None:
    lease = Lease(owner="", deadline_s=100.0)
    assert Run().feed([_poll(t, lease) for t in (1, 2, 3, 4)]).verdict is Verdict.STUCK


def test_now_s_overrides_the_call_times() -> None:
    lease = Lease(owner="alice", deadline_s=10.0)
    calls = [_poll(t, lease) for t in (1, 2, 3, 4)]
    assert Run().feed(calls, now_s=11.0).verdict is Verdict.STUCK
    assert Run().feed(calls, now_s=9.0).verdict is Verdict.WAITING


def test_run_level_lease() -> None:
    run = Run()
    run.state.lease = Lease(owner="payments-queue", deadline_s=100.0)
    run.feed([_poll(t) for t in (1, 2, 3, 4)])
    assert run.verdict is Verdict.WAITING


def test_lease_comes_before_the_retry_policy() -> None:
    lease = Lease(owner="alice", deadline_s=100.0)
    policy = ISSUE.evolve(retry=RetryPolicy(errors={"pending"}, max_attempts=10))
    run = Run(policy).feed([_poll(t, lease, error_type="pending") for t in (1, 2, 3, 4)])
    assert run.verdict is Verdict.WAITING


# -- 2. retry policies ---------------------------------------------------------------------------

RATE_LIMITED = RetryPolicy(errors={"rate_limited"}, interval_s=2, backoff_rate=2, max_attempts=4)


def _attempts(gaps: Sequence[float], errors: Sequence[str | None] | None = None, **extra: Any) -> list[ToolCall]:
    """Identical calls; call k+1 starts gaps[k] seconds after call k ended (each lasts 0.5 s)."""
    n = len(gaps) + 1
    errors = list(errors) if errors is not None else ["rate_limited"] * n
    calls: list[ToolCall] = []
    start = 0.0
    for i in range(n):
        calls.append(
            ToolCall(
                tool="fetch_quote",
                arguments={"symbol": "ACME"},
                start_s=start,
                end_s=start + 0.5,
                error_type=errors[i],
                **extra,
            )
        )
        if i < len(gaps):
            start = start + 0.5 + gaps[i]
    return calls


def test_rate_limited_call_retried_after_2s_then_4s_is_retrying() -> None:
    # Trip at the 3rd call (threshold 3): attempt 3 after a 4 s gap; schedule: 2 * 2**(3-2) = 4.
    policy = ISSUE.evolve(threshold=3, retry=RATE_LIMITED)
    run = Run(policy).feed(_attempts([2, 4]))
    assert run.trips == [(3, Rule.REPETITION)]
    assert run.verdict is Verdict.RETRYING


def test_retries_on_schedule_up_to_max_attempts_are_retrying() -> None:
    # Attempt 4 after 2, 4, 8 s: the 4th call trips the repetition rule inside the policy.
    run = Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(_attempts([2, 4, 8]))
    assert run.trips == [(4, Rule.REPETITION)]
    assert run.verdict is Verdict.RETRYING
    assert "attempt 4 of 4" in run.current.reason


def test_attempts_running_out_is_stuck() -> None:
    run = Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(_attempts([2, 4, 8, 16]))
    assert run.changes() == [(1, Verdict.WORKING), (4, Verdict.RETRYING), (5, Verdict.STUCK)]


def test_a_gap_shorter_than_the_schedule_is_stuck() -> None:
    run = Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(_attempts([2, 4, 7.9]))
    assert run.verdict is Verdict.STUCK


def test_tolerance_accepts_a_slightly_short_gap() -> None:
    tolerant = RetryPolicy(errors={"rate_limited"}, interval_s=2, backoff_rate=2, max_attempts=4, tolerance_s=0.5)
    assert Run(ISSUE.evolve(retry=tolerant)).feed(_attempts([2, 4, 7.9])).verdict is Verdict.RETRYING
    assert Run(ISSUE.evolve(retry=tolerant)).feed(_attempts([2, 4, 7.4])).verdict is Verdict.STUCK


def test_error_class_change_is_not_covered() -> None:
    errors = ["rate_limited", "rate_limited", "bad_request", "rate_limited"]
    run = Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(_attempts([2, 4, 8], errors))
    assert run.verdict is Verdict.STUCK


def test_emitter_attempt_number_is_used() -> None:
    calls = _attempts([2, 4, 8])
    # Same calls, but the emitter says the 4th is attempt 5: beyond max_attempts.
    c = calls[3]
    calls[3] = ToolCall(
        tool=c.tool, arguments=c.arguments, start_s=c.start_s, end_s=c.end_s, error_type=c.error_type, attempt=5
    )
    assert Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(calls).verdict is Verdict.STUCK


def test_retryable_flag_is_covered_by_default() -> None:
    policy = ISSUE.evolve(retry=RetryPolicy(max_attempts=5))
    calls = _attempts([1, 1, 1], ["boom"] * 4, retryable=True)
    assert Run(policy).feed(calls).verdict is Verdict.RETRYING
    strict = ISSUE.evolve(retry=RetryPolicy(max_attempts=5, retryable_flag=False))
    assert Run(strict).feed(calls).verdict is Verdict.STUCK


def test_per_tool_retry_policy_applies_to_its_tool_only() -> None:
    calls = _attempts([2, 4, 8])
    assert Run(ISSUE.evolve(retry_per_tool={"fetch_quote": RATE_LIMITED})).feed(calls).verdict is Verdict.RETRYING
    assert Run(ISSUE.evolve(retry_per_tool={"other": RATE_LIMITED})).feed(calls).verdict is Verdict.STUCK


def test_previous_call_succeeded_is_not_a_retry() -> None:
    errors: list[str | None] = ["rate_limited", "rate_limited", None, "rate_limited"]
    assert Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(_attempts([2, 4, 8], errors)).verdict is Verdict.STUCK


def test_retry_comes_before_evidence() -> None:
    calls = _attempts([2, 4, 8], progress="same")
    assert Run(ISSUE.evolve(retry=RATE_LIMITED)).feed(calls).verdict is Verdict.RETRYING


# -- 3. evidence ---------------------------------------------------------------------------------


def _with(field: str, values: Sequence[str | None], tool: str = "search_docs") -> list[ToolCall]:
    return [ToolCall(tool=tool, arguments={"query": "refund policy"}, **{field: v}) for v in values]


def test_changed_progress_fingerprint_is_working() -> None:
    run = Run().feed(_with("progress", ["p1", "p2", "p3", "p4"]))
    assert run.trips == [(4, Rule.REPETITION)]
    assert run.verdict is Verdict.WORKING
    assert run.changes() == [(1, Verdict.WORKING)]  # working all along: no event


def test_unchanged_progress_fingerprint_is_stuck() -> None:
    assert Run().feed(_with("progress", ["p1"] * 4)).verdict is Verdict.STUCK


def test_progress_compares_first_and_last_of_the_repeated_calls() -> None:
    # Back where it started: the first and the last fingerprint are equal.
    assert Run().feed(_with("progress", ["a", "b", "c", "a"])).verdict is Verdict.STUCK


def test_polling_tool_with_changed_results_is_working() -> None:
    policy = ISSUE.evolve(polling_tools=frozenset({"check_status"}))
    changed = _with("result_digest", ["r1", "r2", "r3", "r4"], tool="check_status")
    same = _with("result_digest", ["r1"] * 4, tool="check_status")
    assert Run(policy).feed(changed).verdict is Verdict.WORKING
    assert Run(policy).feed(same).verdict is Verdict.STUCK


def test_changed_results_of_a_non_polling_tool_count_only_under_all() -> None:
    changed = _with("result_digest", ["r1", "r2", "r3", "r4"])
    assert Run(ISSUE).feed(changed).verdict is Verdict.STUCK  # result_evidence="polling"
    assert Run(ISSUE.evolve(result_evidence="all")).feed(changed).verdict is Verdict.WORKING
    off = ISSUE.evolve(result_evidence="off", polling_tools=frozenset({"search_docs"}))
    assert Run(off).feed(changed).verdict is Verdict.STUCK


def test_require_evidence_without_any_is_uncertain() -> None:
    policy = ISSUE.evolve(require_evidence=True)
    run = Run(policy).feed([x_call() for _ in range(4)])
    assert run.verdict is Verdict.UNCERTAIN
    assert run.current.rule is Rule.REPETITION


def test_require_evidence_with_unchanged_evidence_is_stuck() -> None:
    policy = ISSUE.evolve(require_evidence=True)
    assert Run(policy).feed(_with("progress", ["p"] * 4)).verdict is Verdict.STUCK


def test_uncertain_is_sticky_like_stuck() -> None:
    run = Run(ISSUE.evolve(require_evidence=True)).feed([x_call() for _ in range(4)])
    run.feed(fillers(9))
    assert run.verdict is Verdict.UNCERTAIN
    run.feed(fillers(1, 9))
    assert run.verdict is Verdict.WORKING


def test_name_only_signatures_are_uncertain_by_default() -> None:
    calls = [ToolCall(tool="search_docs") for _ in range(4)]
    run = Run().feed(calls)
    assert run.verdict is Verdict.UNCERTAIN
    assert run.current.arguments_seen is False
    assert "capture" in run.current.reason


def test_name_only_signatures_are_stuck_under_tool_key_or_name_only_stuck() -> None:
    calls = [ToolCall(tool="search_docs") for _ in range(4)]
    assert Run(ISSUE.evolve(key="tool")).feed(calls).verdict is Verdict.STUCK
    assert Run(ISSUE.evolve(name_only="stuck")).feed(calls).verdict is Verdict.STUCK


# -- state ---------------------------------------------------------------------------------------


def test_state_is_sized_for_the_policy() -> None:
    state = RunState.new(LoopPolicy(window=7, threshold=3))
    assert len(state.keys) == 7
    assert state.calls == 0
    assert state.current is None


def test_state_stays_bounded_on_long_runs() -> None:
    run = Run(ISSUE).feed(
        ToolCall(tool="t", arguments={"i": i}, error_type="E" if i % 2 else None) for i in range(2000)
    )
    assert len(run.state.counts) <= 10
    assert run.state.failures is None or len(run.state.failures) <= 10


def test_state_after_ten_calls_is_under_two_kilobytes() -> None:
    run = Run(DEFAULT_POLICY).feed(make_calls("ABCDEFGHIJ"))
    shared = (DEFAULT_POLICY, DEFAULT_POLICY.version, DEFAULT_NORMALIZER.version, run.current.reason)
    assert deep_sizeof(run.state, exclude=shared) <= 2048


# -- failures and the windowed revisit rule (issue 7) --------------------------------------------


def _failing(i: int, error: str = "command_not_found") -> ToolCall:
    return ToolCall(tool=f"cmd_{i}", arguments={"i": i}, error_type=error)


def _ok(i: int) -> ToolCall:
    return ToolCall(tool=f"ok_{i}", arguments={"i": i}, result_digest=f"out{i}")


def test_failures_rule_trips_when_eight_of_the_last_ten_calls_failed() -> None:
    # Different commands, different error classes: no other rule sees a loop here.
    errors = ["command_not_found", "timeout", "exception"]
    calls = [_ok(0), _failing(1, errors[0]), _failing(2, errors[1]), _ok(3)]
    calls += [_failing(i, errors[i % 3]) for i in range(4, 10)]  # failures 7 and 8 of 10
    run = Run(DEFAULT_POLICY).feed(calls[:9])
    assert run.trips == []  # 7 of the last 9
    run.feed(calls[9:])
    assert run.trips == [(10, Rule.FAILURES)]
    assert (run.verdict, run.current.hits, run.current.window) == (Verdict.STUCK, 8, 10)
    assert run.current.reason.startswith("8 of the last 10 calls, up to cmd_9, failed")


def test_failures_rule_counts_only_the_last_window() -> None:
    # Seven failures, then successes push the early ones out: the count never reaches 8.
    errors = ["command_not_found", "timeout"]
    calls = [_failing(i, errors[i % 2]) for i in range(7)] + [_ok(i) for i in range(7, 10)]
    calls += [_failing(i, errors[i % 2]) for i in range(10, 14)]
    run = Run(DEFAULT_POLICY).feed(calls)
    assert run.trips == []
    assert run.state.failed_recent == 7  # calls 5..7 and 11..14 of the last ten (5..14)


def test_failures_rule_scales_with_the_window_and_can_be_switched_off() -> None:
    policy = DEFAULT_POLICY.evolve(window=5)  # 0.8 of 5 = 4 failures
    assert Run(policy).feed([_failing(i) for i in range(4)]).trips[:1] == [(4, Rule.FAILURES)]
    assert Run(DEFAULT_POLICY.evolve(failure_share=None, same_error=None)).feed([_failing(i) for i in range(12)]).trips == []


def test_failures_with_a_changing_progress_fingerprint_are_working() -> None:
    calls = [ToolCall(tool=f"cmd_{i}", arguments={"i": i}, error_type="exception", progress=f"p{i}") for i in range(10)]
    run = Run(DEFAULT_POLICY.evolve(same_error=None)).feed(calls)
    assert run.verdict is Verdict.WORKING
    assert run.current.rule is Rule.FAILURES
    assert "progress fingerprint changed" in run.current.reason


def _probe(i: int) -> ToolCall:
    return ToolCall(tool="grep", arguments={"pattern": f"p{i}"}, result_digest="")


def test_windowed_revisit_catches_revisits_interleaved_with_new_calls() -> None:
    # Four searches, then the same four again and again with one new call between rounds: never
    # six revisits in a row, but 8 of the last 10 calls repeat an earlier call and its result.
    first = [_probe(i) for i in range(4)]
    again = [_probe(i) for i in (2, 0, 3, 1)]  # out of order: not a batch done again
    calls = [*first, _ok(100), *again, _ok(101), *again]
    policy = DEFAULT_POLICY.evolve(same_result=None)
    run = Run(policy).feed(calls)
    assert run.trips == [(14, Rule.REVISIT)]
    assert run.current.hits == 8
    assert run.current.reason.startswith("8 of the last 10 calls, ending with grep, each repeated")
    assert Run(policy.evolve(revisit_share=None)).feed(calls).trips == []


def test_a_rule_explained_away_does_not_hide_another_that_is_not() -> None:
    # The same edit, first with one result then always with another: the repetition rule sees
    # results that differ in its window (working), but from call 3 on every call repeats an
    # earlier call with the same result; at call 8 that is six revisits in a row (stuck).
    edit = {"path": "a.py", "line": 166, "text": "x = 1"}
    calls = [ToolCall(tool="edit", arguments=edit, result_digest="r1")]
    calls += [ToolCall(tool="edit", arguments=edit, result_digest="r2") for _ in range(7)]
    run = Run(DEFAULT_POLICY.evolve(same_result=None)).feed(calls)
    assert run.changes() == [(1, Verdict.WORKING), (8, Verdict.STUCK)]
    assert run.current.rule is Rule.REVISIT
    # With the revisit rules off, the repetition rule's evidence stands: working.
    quiet = DEFAULT_POLICY.evolve(same_result=None, revisit=None, revisit_share=None)
    assert Run(quiet).feed(calls).verdict is Verdict.WORKING
