"""The run guard end to end, in-process: every limit through the stateful shell."""

from __future__ import annotations

import asyncio
import pickle
import threading
import uuid
import warnings
from typing import Any

import pytest

from tripwire.core.budget import Level, Limits
from tripwire.core.reasons import Rule, StopReason, Verdict
from tripwire.core.results import ToolResult
from tripwire.errors import BudgetExceeded, ConfigError, LoopDetected, RunStopped
from tripwire.guard import Guard, GuardSnapshot
from tripwire.prices import CostNotFoundWarning


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_steps_limit_minus_one_limit_plus_one_with_partial_answer() -> None:
    guard = Guard(Limits(max_steps=3), loop_policy=None)
    seen: list[GuardSnapshot] = []

    def partial(snap: GuardSnapshot) -> str:
        seen.append(snap)
        return f"partial answer after {snap.counters.steps} steps"

    guard.partial_answer = partial
    guard.before_step()
    guard.before_step()
    assert guard.before_step().level is Level.RESTRICT  # step 3 of 3: the last
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    exc = info.value
    assert exc.reason is StopReason.MAX_STEPS
    assert (exc.limit_name, exc.limit, exc.observed) == ("max_steps", 3, 4)
    assert exc.counters.steps == 3
    assert exc.partial == "partial answer after 3 steps"
    assert seen[0].reason is StopReason.MAX_STEPS
    assert seen[0].condition == {"steps": 3, "requested": 1, "max_steps": 3}


def test_a_stopped_run_stays_stopped_and_the_hook_runs_once() -> None:
    calls = []
    guard = Guard(Limits(max_steps=1), loop_policy=None)
    guard.partial_answer = lambda snap: calls.append(1) or "p"
    guard.before_step()
    with pytest.raises(BudgetExceeded) as first:
        guard.before_step()
    with pytest.raises(BudgetExceeded) as again:
        guard.before_tool("search", {"q": 1})
    assert again.value is first.value
    assert calls == [1]
    assert guard.reason is StopReason.MAX_STEPS
    assert guard.stopped is first.value


def test_the_exception_pickles_with_counters_and_partial() -> None:
    guard = Guard(Limits(max_tool_calls=0), loop_policy=None)
    guard.partial_answer = lambda snap: {"answer": "so far"}
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("search", {"q": 1})
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.reason is StopReason.MAX_TOOL_CALLS
    assert copy.partial == {"answer": "so far"}
    assert copy.counters.tool_calls == 0
    assert str(copy) == str(info.value)


def test_a_failing_hook_does_not_hide_the_stop() -> None:
    guard = Guard(Limits(max_steps=0), loop_policy=None)

    def broken(snap: GuardSnapshot) -> str:
        raise KeyError("bug in the runner's hook")

    guard.partial_answer = broken
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    assert info.value.partial is None
    assert guard.hook_errors == 1


@pytest.mark.parametrize(("cap", "allowed"), [(2, 2), (3, 3), (4, 4)])
def test_tool_calls_cap_allows_exactly_n(cap: int, allowed: int) -> None:
    guard = Guard(Limits(max_tool_calls=cap), loop_policy=None)
    done = 0
    with pytest.raises(BudgetExceeded) as info:
        for i in range(10):
            guard.before_tool("search", {"q": i})
            done += 1
    assert done == allowed
    assert info.value.reason is StopReason.MAX_TOOL_CALLS
    assert info.value.counters.tool_calls == cap


def test_per_tool_cap_and_advisory() -> None:
    guard = Guard(Limits(tool_caps={"send_email": 1, "search": 5}), loop_policy=None)
    adv = guard.before_tool("send_email", {"to": "a@example.com"})
    assert adv.level is Level.ADVISE and adv.remaining == 0
    for i in range(3):
        assert guard.before_tool("search", {"q": i}).ok
    assert guard.before_tool("search", {"q": 9}).remaining == 1  # 4 of 5: 80 %
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("send_email", {"to": "b@example.com"})
    assert info.value.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL
    assert info.value.limit_name == "tool_caps['send_email']"
    assert info.value.counters.tool_calls_by_tool == {"send_email": 1, "search": 4}


def test_parallel_batch_is_refused_as_a_whole() -> None:
    guard = Guard(Limits(max_tool_calls=4), loop_policy=None)
    guard.before_tools([("a", {"i": 1}), ("b", {"i": 2}), ("c", {"i": 3})])
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tools([("a", {"i": 4}), ("b", {"i": 5})])
    assert info.value.counters.tool_calls == 3  # nothing of the refused batch was counted
    assert (info.value.limit, info.value.observed) == (4, 5)


def test_parallel_batch_under_a_per_tool_cap() -> None:
    guard = Guard(Limits(tool_caps={"send_email": 2}), loop_policy=None)
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tools([("send_email", {"to": x}) for x in "abc"])
    assert info.value.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL
    assert info.value.counters.tool_calls == 0


@pytest.mark.parametrize(("cap", "allowed"), [(1, 1), (2, 2)])
def test_duplicate_calls(cap: int, allowed: int) -> None:
    guard = Guard(Limits(max_duplicate_calls=cap), loop_policy=None)
    done = 0
    with pytest.raises(BudgetExceeded) as info:
        for _ in range(5):
            guard.before_tool("search", {"q": "same", "timestamp": done})  # volatile key ignored
            done += 1
    assert done == allowed
    assert info.value.reason is StopReason.MAX_DUPLICATE_CALLS
    guard2 = Guard(Limits(max_duplicate_calls=1), loop_policy=None)
    guard2.before_tool("search", {"q": "a"})
    guard2.before_tool("search", {"q": "b"})  # different arguments: fine


def test_loop_detected_before_the_fourth_call_with_partial_answer() -> None:
    guard = Guard()
    guard.partial_answer = lambda snap: f"stopped after {snap.counters.tool_calls} calls"
    with pytest.raises(LoopDetected) as info:
        for _ in range(10):
            guard.before_tool("search_docs", {"query": "refund policy"})
            guard.after_tool(
                "search_docs", {"query": "refund policy"}, ToolResult.success("no results")
            )
    exc = info.value
    assert exc.reason is StopReason.LOOP_DETECTED
    assert (exc.rule, exc.tool, exc.hits, exc.call_index) == (Rule.REPETITION, "search_docs", 4, 4)
    assert exc.partial == "stopped after 3 calls"  # the 4th was refused before it ran
    assert guard.snapshot().verdict is Verdict.STUCK


def test_loop_policy_none_switches_the_watcher_off() -> None:
    guard = Guard(loop_policy=None)
    for _ in range(20):
        guard.before_tool("poll", {"job": 1})
        guard.after_tool("poll", {"job": 1}, ToolResult.success("pending"))
    assert guard.snapshot().counters.tool_calls == 20


def test_retry_of_non_retryable_is_refused_before_it_runs() -> None:
    guard = Guard(loop_policy=None)
    args = {"card": "4242", "amount": 10}
    guard.before_tool("charge", args)
    guard.after_tool("charge", args, ToolResult.error("card_declined", retryable=False))
    guard.before_tool("charge", {"card": "4242", "amount": 5})  # other arguments: allowed
    with pytest.raises(LoopDetected) as info:
        guard.before_tool("charge", dict(args))
    assert info.value.reason is StopReason.RETRY_OF_NON_RETRYABLE
    assert info.value.rule is Rule.RETRY_OF_NON_RETRYABLE
    assert info.value.counters.tool_calls == 2  # the refused call was not counted


def test_retryable_errors_and_successes_do_not_refuse() -> None:
    guard = Guard(loop_policy=None)
    guard.before_tool("fetch", {"u": 1})
    guard.after_tool("fetch", {"u": 1}, ToolResult.error("timeout", retryable=True))
    guard.before_tool("fetch", {"u": 1})  # a retryable error: the retry is allowed
    guard.after_tool("fetch", {"u": 1}, ToolResult.success("ok"))
    guard.before_tool("fetch", {"u": 1})  # and so is a call that succeeded before
    guard.after_tool("fetch", {"u": 1}, ToolResult.error("gone", retryable=False))
    with pytest.raises(LoopDetected):
        guard.before_tool("fetch", {"u": 1})


def test_a_non_retryable_failure_is_forgotten_after_a_window_of_calls() -> None:
    # The watcher decides retry-of-non-retryable for the calls still in its window.
    guard = Guard(loop_policy=None)
    guard.before_tool("fetch", {"u": 1})
    guard.after_tool("fetch", {"u": 1}, ToolResult.error("gone", retryable=False))
    for i in range(9):
        guard.before_tool("other", {"i": i})
        guard.after_tool("other", {"i": i}, ToolResult.success(i))
    guard.before_tool("fetch", {"u": 1})  # 10 calls later: no longer in the window


def test_tool_result_validation() -> None:
    with pytest.raises(ConfigError):
        ToolResult(ok=False)
    with pytest.raises(ConfigError):
        ToolResult(ok=True, code="x")
    assert ToolResult.error("e", retryable=False).retryable is False


def test_tokens_stop_after_the_usage_report() -> None:
    guard = Guard(Limits(max_total_tokens=1000), loop_policy=None, prices=None)
    assert guard.record_usage(input_tokens=700, output_tokens=99).ok  # 799
    adv = guard.record_usage(input_tokens=1, output_tokens=0)  # 800: advise
    assert adv.level is Level.ADVISE
    adv = guard.record_usage(input_tokens=100, output_tokens=0)  # 900: restrict
    assert adv.level is Level.RESTRICT
    refused = guard.before_tool("search", {"q": 1})
    assert not refused.allowed and refused.level is Level.RESTRICT
    assert "without tools" in refused.message
    assert guard.snapshot().counters.tool_calls == 0
    with pytest.raises(BudgetExceeded) as info:
        guard.record_usage(input_tokens=50, output_tokens=50)  # 1000: reached
    assert info.value.reason is StopReason.MAX_TOTAL_TOKENS
    assert info.value.observed == 1000
    assert info.value.counters.total_tokens == 1000


def test_cost_from_genai_prices() -> None:
    guard = Guard(Limits(max_cost_usd=0.01), loop_policy=None)
    # gpt-4o: $2.50 per million input tokens, $10 per million output tokens
    guard.record_usage(model="gpt-4o", input_tokens=1000, output_tokens=100)
    assert guard.snapshot().counters.cost_usd == pytest.approx(0.0035)
    guard.record_usage(model="gpt-4o", input_tokens=1000, output_tokens=100)  # 0.007
    with pytest.raises(BudgetExceeded) as info:
        guard.record_usage(model="gpt-4o", input_tokens=1000, output_tokens=100)  # 0.0105
    assert info.value.reason is StopReason.MAX_COST
    assert info.value.observed == pytest.approx(0.0105)


def test_reported_cost_wins_over_the_table() -> None:
    guard = Guard(Limits(max_cost_usd=1.0), loop_policy=None)
    guard.record_usage(model="gpt-4o", input_tokens=10**6, output_tokens=0, cost_usd=0.25)
    assert guard.snapshot().counters.cost_usd == pytest.approx(0.25)


def test_unknown_model_warns_once_and_is_not_a_silent_zero() -> None:
    model = f"no-such-model-{uuid.uuid4().hex[:8]}"
    guard = Guard(Limits(max_cost_usd=0.01), loop_policy=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        guard.record_usage(model=model, input_tokens=10, output_tokens=10)
        guard.record_usage(model=model, input_tokens=10, output_tokens=10)
    found = [w for w in caught if issubclass(w.category, CostNotFoundWarning)]
    assert len(found) == 1
    assert model in str(found[0].message) and "cannot be enforced" in str(found[0].message)
    counters = guard.snapshot().counters
    assert counters.unpriced_calls == 2 and counters.cost_usd == 0


def test_duration_levels_and_deadline() -> None:
    clock = FakeClock()
    guard = Guard(Limits(max_duration_s=100), loop_policy=None, clock=clock)
    clock.now += 79
    assert guard.before_step().ok
    clock.now += 1  # 80 s
    assert guard.before_step().level is Level.ADVISE
    assert guard.before_tool("a", {}).allowed
    clock.now += 10  # 90 s: restrict
    refused = guard.before_tool("a", {})
    assert not refused.allowed and refused.limit_name == "max_duration_s"
    clock.now += 10  # 100 s
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    assert info.value.reason is StopReason.MAX_DURATION
    assert info.value.observed == 100


def test_deadline_is_checked_before_tool_calls() -> None:
    clock = FakeClock()
    guard = Guard(Limits(max_duration_s=5), loop_policy=None, clock=clock)
    clock.now += 5
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("a", {})
    assert info.value.reason is StopReason.MAX_DURATION


@pytest.mark.parametrize(("cap", "stalled_steps_allowed"), [(1, 1), (2, 2)])
def test_no_progress(cap: int, stalled_steps_allowed: int) -> None:
    guard = Guard(Limits(max_no_progress_steps=cap), loop_policy=None)
    guard.before_step()
    guard.progress("facts:1")
    stalled = 0
    with pytest.raises(BudgetExceeded) as info:
        for _ in range(5):
            guard.before_step()
            guard.progress("facts:1")  # nothing new this step
            stalled += 1
    assert stalled == stalled_steps_allowed
    assert info.value.reason is StopReason.NO_PROGRESS


def test_progress_resets_the_streak() -> None:
    # every other step repeats the fingerprint: the streak never passes 1 of 2
    guard = Guard(Limits(max_no_progress_steps=2), loop_policy=None)
    for i in range(6):
        guard.before_step()
        guard.progress(f"facts:{i // 2}")  # changes every other step
    assert guard.snapshot().counters.steps == 6


def test_restricted_last_step_refuses_tools_without_counting() -> None:
    guard = Guard(Limits(max_steps=2), loop_policy=None)
    guard.before_step()
    assert guard.before_tool("search", {"q": 1}).allowed
    last = guard.before_step()
    assert last.level is Level.RESTRICT
    refusal = guard.before_tools([("search", {"q": 2}), ("fetch", {"u": 1})])
    assert not refusal.allowed
    assert refusal.message == (
        "Tool call refused, the run is near its max_steps limit (this is the last step). "
        "Answer now from what you have, without tools."
    )
    assert guard.snapshot().counters.tool_calls == 1


def test_a_call_that_cannot_be_refused_is_counted_and_its_cap_still_holds() -> None:
    # A framework callback cannot hand a refusal to the model: the call runs whatever the
    # guard says. The receipt must count it, and a count cap must stop the run, not let it by.
    guard = Guard(Limits(max_steps=2, max_tool_calls=3), loop_policy=None)
    guard.before_step()
    guard.before_tool("search", {"q": 1})
    guard.after_tool("search", {"q": 1}, ToolResult.success("a"))
    assert guard.before_step().level is Level.RESTRICT
    said = guard.before_tool("search", {"q": 2}, refusable=False)
    assert not said.allowed and "last step" in (said.message or "")  # what was not delivered
    guard.after_tool("search", {"q": 2}, ToolResult.success("b"))
    assert guard.snapshot().counters.tool_calls == 2
    guard.before_tool("search", {"q": 3}, refusable=False)
    with pytest.raises(BudgetExceeded):
        guard.before_tool("search", {"q": 4}, refusable=False)
    assert guard.snapshot().counters.tool_calls == 3


def test_a_nudge_that_cannot_be_delivered_counts_the_call_and_stops_the_run_when_it_ends() -> None:
    guard = Guard(on_loop="nudge")
    args = {"query": "refund policy"}
    for _ in range(3):
        guard.before_tool("search_docs", args)
        guard.after_tool("search_docs", args, ToolResult.success("no results"))
    said = guard.before_tool("search_docs", args, refusable=False)
    assert said.message == NUDGE
    # It ran: the 4th identical call, after the nudge, trips the rule again: the stop.
    with pytest.raises(LoopDetected):
        guard.after_tool("search_docs", args, ToolResult.success("no results"))
    assert guard.snapshot().counters.tool_calls == 4
    with pytest.raises(LoopDetected):
        guard.before_tool("search_docs", args, refusable=False)


# -- sub-agents ---------------------------------------------------------------------------


def test_child_has_its_own_tighter_budget_and_spends_the_parents() -> None:
    parent = Guard(Limits(max_tool_calls=5, max_subagents=3), loop_policy=None)
    child = parent.subagent(Limits(max_tool_calls=3))
    for i in range(3):
        child.before_tool("search", {"q": i})
    with pytest.raises(BudgetExceeded) as info:
        child.before_tool("search", {"q": 99})
    assert info.value.limit == 3  # the child's own cap fired
    second = parent.subagent(Limits(max_tool_calls=3))
    second.before_tool("search", {"q": "x"})
    second.before_tool("search", {"q": "y"})
    with pytest.raises(BudgetExceeded) as info:
        second.before_tool("search", {"q": "z"})  # the parent's 5 are spent
    assert info.value.limit == 5 and info.value.reason is StopReason.MAX_TOOL_CALLS
    assert parent.snapshot().counters.tool_calls == 5
    with pytest.raises(BudgetExceeded):
        parent.before_tool("search", {"q": "parent"})


def test_nested_subagents_share_tokens_cost_and_the_subagent_count() -> None:
    root = Guard(Limits(max_cost_usd=1.0, max_subagents=2), loop_policy=None)
    child = root.subagent(Limits(max_cost_usd=0.8))
    grandchild = child.subagent()  # counts against the root's max_subagents too
    grandchild.record_usage(input_tokens=10, output_tokens=5, cost_usd=0.5)
    assert root.snapshot().counters.cost_usd == pytest.approx(0.5)
    assert child.snapshot().counters.cost_usd == pytest.approx(0.5)
    assert root.snapshot().counters.subagents == 2
    with pytest.raises(BudgetExceeded) as info:
        root.subagent()
    assert info.value.reason is StopReason.MAX_SUBAGENTS
    with pytest.raises(BudgetExceeded) as info2:
        grandchild.record_usage(cost_usd=0.3)  # 0.8: the child's limit fires
    assert info2.value.reason is StopReason.MAX_COST and info2.value.limit == 0.8


def test_child_usage_stops_the_parent_at_its_next_step() -> None:
    root = Guard(Limits(max_total_tokens=100), loop_policy=None, prices=None)
    child = root.subagent()
    with pytest.raises(BudgetExceeded):
        child.record_usage(input_tokens=80, output_tokens=30)
    with pytest.raises(BudgetExceeded) as info:
        root.before_step()
    assert info.value.reason is StopReason.MAX_TOTAL_TOKENS


def test_child_inherits_the_parents_deadline() -> None:
    clock = FakeClock()
    root = Guard(Limits(max_duration_s=10), loop_policy=None, clock=clock)
    clock.now += 4
    child = root.subagent(Limits(max_duration_s=60))
    clock.now += 6
    with pytest.raises(BudgetExceeded) as info:
        child.before_step()
    assert info.value.reason is StopReason.MAX_DURATION and info.value.limit == 10


# -- concurrency --------------------------------------------------------------------------


def test_threads_spend_exactly_the_cap() -> None:
    guard = Guard(Limits(max_tool_calls=200), loop_policy=None)
    parent_ok: list[int] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        ok = 0
        for i in range(100):
            try:
                guard.before_tool("t", {"w": n, "i": i})
            except BudgetExceeded:
                break
            ok += 1
        with lock:
            parent_ok.append(ok)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(parent_ok) == 200


async def test_async_variants_and_tasks_share_one_budget() -> None:
    guard = Guard(Limits(max_tool_calls=10), loop_policy=None)

    async def agent(n: int) -> int:
        ok = 0
        for i in range(10):
            try:
                await guard.abefore_tool("t", {"n": n, "i": i})
            except BudgetExceeded:
                return ok
            ok += 1
            await asyncio.sleep(0)
        return ok

    results = await asyncio.gather(*(agent(n) for n in range(4)))
    assert sum(results) == 10


# -- timeouts -----------------------------------------------------------------------------


def test_sync_timeout_stops_the_run() -> None:
    guard = Guard(loop_policy=None)
    release = threading.Event()

    def slow_tool() -> str:
        release.wait(5)
        return "late"

    try:
        with pytest.raises(BudgetExceeded) as info:
            guard.timeout(slow_tool, 0.05)
    finally:
        release.set()
    assert info.value.reason is StopReason.MAX_DURATION
    assert info.value.limit_name == "tool_timeout_s" and info.value.limit == 0.05
    assert guard.timeout is not None and guard.reason is StopReason.MAX_DURATION


def test_sync_timeout_passes_results_and_errors_through() -> None:
    guard = Guard(Limits(tool_timeout_s=5), loop_policy=None)
    assert guard.timeout(lambda a, b: a + b, None, 2, 3) == 5

    def failing() -> None:
        raise ValueError("tool bug")

    with pytest.raises(ValueError, match="tool bug"):
        guard.timeout(failing)


async def test_async_timeout() -> None:
    guard = Guard(loop_policy=None)
    assert await guard.atimeout(asyncio.sleep(0, result=7), 1.0) == 7
    with pytest.raises(BudgetExceeded) as info:
        await guard.atimeout(asyncio.sleep(5), 0.05)
    assert info.value.reason is StopReason.MAX_DURATION
    assert info.value.limit_name == "tool_timeout_s"


def test_timeout_is_cut_by_the_run_deadline() -> None:
    clock = FakeClock()
    guard = Guard(Limits(max_duration_s=10, tool_timeout_s=60), loop_policy=None, clock=clock)
    clock.now += 9.95  # 0.05 s of the run left
    release = threading.Event()
    try:
        with pytest.raises(BudgetExceeded) as info:
            guard.timeout(lambda: release.wait(5))
    finally:
        release.set()
    assert info.value.limit_name == "max_duration_s"


# -- receipts -----------------------------------------------------------------------------


def test_receipt_from_a_budget_stop() -> None:
    from tripwire.core.receipt import EndKind, HealthState, classify

    guard = Guard(Limits(max_tool_calls=2), loop_policy=None)
    guard.before_step()
    guard.before_tool("a", {"i": 1})
    guard.before_tool("a", {"i": 2})
    with pytest.raises(BudgetExceeded):
        guard.before_tool("a", {"i": 3})
    receipt = guard.receipt("researcher")
    assert receipt.reason is StopReason.MAX_TOOL_CALLS
    assert receipt.end is EndKind.STOP_CONDITION
    assert receipt.condition == {"tool_calls": 2, "requested": 1, "max_tool_calls": 2}
    assert receipt.counters.tool_calls == 2 and receipt.counters.steps == 1
    assert classify(receipt).state is HealthState.BOUNDED_STOP


def test_receipt_of_a_completed_run() -> None:
    from tripwire.core.receipt import EndKind

    guard = Guard(loop_policy=None)
    guard.before_step()
    guard.finish()
    receipt = guard.receipt("writer")
    assert receipt.reason is StopReason.COMPLETED and receipt.end is EndKind.NATURAL_FINISH


def test_only_run_stopped_subclasses_escape() -> None:
    assert issubclass(BudgetExceeded, RunStopped) and issubclass(LoopDetected, RunStopped)


def test_results_differing_only_in_numbers_are_no_new_evidence() -> None:
    # The guard digests results like the span mapping does (Normalizer.result_digest): a new
    # order id in every confirmation is not progress, so the 4th identical call is a loop.
    guard = Guard(Limits())
    for i in range(3):
        guard.before_tool("create_order", {"sku": "A-1"})
        guard.after_tool("create_order", {"sku": "A-1"}, ToolResult.success(f"order {1000 + i} created"))
    with pytest.raises(LoopDetected) as info:
        guard.before_tool("create_order", {"sku": "A-1"})  # refused before it runs
    assert (info.value.rule, info.value.call_index) == (Rule.REPETITION, 4)


# -- refuse, don't report (issue 14) ------------------------------------------------------


class ScriptedLoop:
    """A hand-written tool loop: the model asks for ``calls`` in order; counts tool bodies."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.bodies: list[tuple[str, str]] = []

    def search_docs(self, query: str) -> str:
        self.bodies.append(("search_docs", query))
        return "no results" if query == "refund policy" else f"what we know about {query}"

    def run(self, queries: list[str]) -> list[str]:
        messages: list[str] = []
        for query in queries:
            args = {"query": query}
            verdict = self.guard.before_tool("search_docs", args)
            if not verdict.allowed:
                messages.append(verdict.message)  # given to the model instead of a result
                continue
            result = self.search_docs(**args)
            self.guard.after_tool("search_docs", args, ToolResult.success(result))
        return messages


def test_the_fourth_identical_call_is_refused_before_its_body_runs() -> None:
    loop = ScriptedLoop(Guard())
    with pytest.raises(LoopDetected) as info:
        loop.run(["refund policy"] * 10)
    assert len(loop.bodies) == 3
    assert (info.value.rule, info.value.hits, info.value.call_index) == (Rule.REPETITION, 4, 4)
    assert info.value.counters.tool_calls == 3


def test_a_batch_with_a_stuck_call_is_refused_before_any_of_it_runs() -> None:
    guard = Guard()
    args = {"query": "refund policy"}
    for _ in range(3):
        guard.before_tool("search_docs", args)
        guard.after_tool("search_docs", args, ToolResult.success("no results"))
    with pytest.raises(LoopDetected):
        guard.before_tools([("read_doc", {"id": 1}), ("search_docs", dict(args))])
    assert guard.snapshot().counters.tool_calls == 3


def test_repeated_calls_whose_results_change_are_not_refused() -> None:
    guard = Guard()
    for state in ("queued", "starting", "running", "copying", "indexing", "finished"):
        guard.before_tool("poll_job", {"job": 7})
        guard.after_tool("poll_job", {"job": 7}, ToolResult.success(state))
    assert guard.reason is None and guard.snapshot().counters.tool_calls == 6


# -- nudge mode ---------------------------------------------------------------------------


NUDGE = (
    "You called search_docs with the same arguments 4 times and it returned the same result. "
    "Try a different approach, or stop and report what you found."
)


def test_nudge_refuses_the_fourth_call_softly_and_does_not_count_it() -> None:
    loop = ScriptedLoop(Guard(on_loop="nudge"))
    messages = loop.run(["refund policy"] * 4)
    assert messages == [NUDGE]
    assert len(loop.bodies) == 3
    snap = loop.guard.snapshot()
    assert snap.counters.tool_calls == 3 and snap.reason is None
    assert loop.guard.nudged is not None and loop.guard.nudged.rule is Rule.REPETITION


def test_nudge_advisory_fields() -> None:
    guard = Guard(on_loop="nudge")
    args = {"query": "refund policy", "customer_email": "ana@example.com"}
    for _ in range(3):
        guard.before_tool("search_docs", args)
        guard.after_tool("search_docs", args, ToolResult.success("no results"))
    adv = guard.before_tool("search_docs", args)
    assert (adv.allowed, adv.level, adv.limit_name) == (False, Level.RESTRICT, "loop")
    assert adv.message == NUDGE
    assert "ana@example.com" not in adv.message and "refund policy" not in adv.message


def test_a_model_that_obeys_the_nudge_carries_on_untouched() -> None:
    guard = Guard(Limits(max_tool_calls=40), on_loop="nudge")
    loop = ScriptedLoop(guard)
    topics = [f"topic {a}{b}" for a in "abcde" for b in "fghijk"]
    messages = loop.run(["refund policy"] * 4 + topics)
    assert messages == [NUDGE]
    assert len(loop.bodies) == 33
    guard.finish()
    receipt = guard.receipt("support")
    assert receipt.reason is StopReason.COMPLETED
    assert receipt.condition["nudged_at_call"] == 4


def test_a_model_that_ignores_the_nudge_is_stopped_at_its_next_repeated_call() -> None:
    guard = Guard(on_loop="nudge")
    loop = ScriptedLoop(guard)
    with pytest.raises(LoopDetected) as info:
        loop.run(["refund policy"] * 10)
    assert len(loop.bodies) == 3  # the nudged call and the one after it never ran
    assert info.value.reason is StopReason.LOOP_DETECTED
    receipt = guard.receipt("support")
    assert receipt.reason is StopReason.LOOP_DETECTED
    assert receipt.condition["nudged_at_call"] == 4


def test_the_nudge_is_not_sticky() -> None:
    guard = Guard(on_loop="nudge")
    loop = ScriptedLoop(guard)
    assert loop.run(["refund policy"] * 4 + ["refund status ana"]) == [NUDGE]
    assert loop.bodies[-1] == ("search_docs", "refund status ana")


def test_after_a_nudge_decided_after_the_call_any_trip_stops_the_run() -> None:
    # Different arguments each time, the same empty result: the same-result rule (6 in a row
    # by default) trips after the call (the watcher could not know the result before). The
    # first time is a nudge, handed out by the next before_tool; at the next trip, even with
    # the verdict unchanged, the run stops.
    guard = Guard(on_loop="nudge")
    bodies = 0
    given: list[str] = []
    with pytest.raises(LoopDetected) as info:
        for i in range(20):
            adv = guard.before_tool("lookup", {"order": i})
            if not adv.allowed:
                given.append(adv.message)
                continue
            bodies += 1
            guard.after_tool("lookup", {"order": i}, ToolResult.success("not found"))
    assert info.value.rule is Rule.SAME_RESULT
    assert len(given) == 1 and given[0].startswith("You called lookup 6 times in a row")
    assert bodies == 7  # 6 to trip, the nudge instead of the 7th, one more to trip again


def test_nudge_of_a_retry_of_a_non_retryable_failure() -> None:
    guard = Guard(on_loop="nudge")
    guard.before_tool("charge", {"card": "4242"})
    guard.after_tool("charge", {"card": "4242"}, ToolResult.error("card_declined", retryable=False))
    adv = guard.before_tool("charge", {"card": "4242"})
    assert not adv.allowed and adv.limit_name == "loop"
    assert adv.message.startswith("You called charge again with the same arguments after it failed")
    with pytest.raises(LoopDetected) as info:
        guard.before_tool("charge", {"card": "4242"})
    assert info.value.reason is StopReason.RETRY_OF_NON_RETRYABLE


def test_on_loop_is_validated() -> None:
    with pytest.raises(ConfigError) as info:
        Guard(on_loop="page")  # type: ignore[arg-type]
    assert info.value.field == "on_loop"


# -- graceful last step -------------------------------------------------------------------


def test_the_last_step_keeps_its_answer_and_the_run_ends_on_max_steps() -> None:
    guard = Guard(Limits(max_steps=2), loop_policy=None, prices=None)
    guard.before_step()
    guard.record_usage(input_tokens=10, output_tokens=10)
    last = guard.before_step()
    assert last.level is Level.RESTRICT and last.limit_name == "max_steps"
    assert guard.record_usage(input_tokens=10, output_tokens=10).level is Level.RESTRICT
    assert guard.reason is StopReason.MAX_STEPS
    guard.finish()
    receipt = guard.receipt("writer")
    assert receipt.reason is StopReason.MAX_STEPS and receipt.counters.steps == 2
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    assert info.value.reason is StopReason.MAX_STEPS


def test_the_last_steps_usage_may_cross_the_cost_limit_without_raising() -> None:
    guard = Guard(Limits(max_cost_usd=0.10), loop_policy=None)
    guard.before_step()
    assert guard.record_usage(cost_usd=0.095).level is Level.RESTRICT
    last = guard.before_step()
    assert last.level is Level.RESTRICT and last.limit_name == "max_cost_usd"
    refusal = guard.before_tool("search", {"q": 1})
    assert not refusal.allowed  # the last step is tool-less
    guard.record_usage(cost_usd=0.02)  # crosses 0.10: recorded, not raised
    assert guard.snapshot().counters.cost_usd == pytest.approx(0.115)
    assert guard.reason is StopReason.MAX_COST
    assert guard.stopped is None
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    assert info.value.reason is StopReason.MAX_COST
    assert info.value.observed == pytest.approx(0.115)


def test_the_last_step_under_a_nearly_spent_token_budget() -> None:
    guard = Guard(Limits(max_total_tokens=1000), loop_policy=None, prices=None)
    guard.before_step()
    guard.record_usage(input_tokens=900, output_tokens=0)
    assert guard.before_step().level is Level.RESTRICT
    guard.record_usage(input_tokens=50, output_tokens=10)  # 960: still under
    assert guard.reason is StopReason.MAX_TOTAL_TOKENS
    with pytest.raises(BudgetExceeded) as info:
        guard.before_step()
    assert info.value.reason is StopReason.MAX_TOTAL_TOKENS
    assert info.value.counters.steps == 2


def test_usage_outside_a_last_step_still_stops_at_the_limit() -> None:
    guard = Guard(Limits(max_cost_usd=0.10), loop_policy=None)
    guard.before_step()
    with pytest.raises(BudgetExceeded):
        guard.record_usage(cost_usd=0.2)


# -- a tool-call cap never refuses the final answer ------------------------------------------


@pytest.mark.parametrize(
    ("limits", "reason"),
    [
        (Limits(max_tool_calls=2), StopReason.MAX_TOOL_CALLS),
        (Limits(tool_caps={"search": 2}), StopReason.MAX_TOOL_CALLS_FOR_TOOL),
        (Limits(max_duplicate_calls=2), StopReason.MAX_DUPLICATE_CALLS),
    ],
)
def test_a_tool_call_cap_leaves_one_tool_less_step(limits: Limits, reason: StopReason) -> None:
    guard = Guard(limits, loop_policy=None, prices=None)
    guard.before_step()
    guard.before_tool("search", {"q": 1})
    guard.before_tool("search", {"q": 1})
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("search", {"q": 1})
    assert info.value.reason is reason
    last = guard.before_step()  # the final answer is not refused
    assert last.level is Level.RESTRICT and "answer now" in last.message
    guard.record_usage(input_tokens=10, output_tokens=5)
    assert guard.snapshot().after_stop_model_calls == 0
    with pytest.raises(BudgetExceeded):
        guard.before_tool("search", {"q": 2})
    with pytest.raises(BudgetExceeded) as again:
        guard.before_step()
    assert again.value is info.value
    assert guard.receipt("r").reason is reason


def test_max_tool_calls_does_not_refuse_a_step_below_it() -> None:
    guard = Guard(Limits(max_tool_calls=1, max_steps=5), loop_policy=None)
    guard.before_step()
    guard.before_tool("a", {})
    assert guard.before_step().ok


# -- activity after a stop ----------------------------------------------------------------


def _stopped_by_a_loop() -> Guard:
    guard = Guard()
    with pytest.raises(LoopDetected):
        ScriptedLoop(guard).run(["refund policy"] * 4)
    return guard


def test_activity_after_the_stop_raises_and_is_counted() -> None:
    guard = _stopped_by_a_loop()
    snap = guard.snapshot()
    assert (snap.after_stop_model_calls, snap.after_stop_tool_calls) == (0, 0)
    # the framework swallowed the stop and went on: one more model call, two tool calls
    with pytest.raises(LoopDetected):
        guard.before_step()
    with pytest.raises(LoopDetected):
        guard.record_usage(input_tokens=5)  # the same model call: counted once
    with pytest.raises(LoopDetected):
        guard.before_tool("search_docs", {"query": "refund policy"})
    with pytest.raises(LoopDetected):
        guard.after_tool("search_docs", {"query": "refund policy"}, ToolResult.success("x"))
    with pytest.raises(LoopDetected):  # a tool body that ran without asking
        guard.after_tool("read_doc", {"id": 1}, ToolResult.success("x"))
    with pytest.raises(LoopDetected):  # a model call reported without before_step
        guard.record_usage(input_tokens=5)
    snap = guard.snapshot()
    assert (snap.after_stop_model_calls, snap.after_stop_tool_calls) == (2, 2)


def test_a_batch_call_that_finishes_after_the_stop_is_not_activity_after_it() -> None:
    guard = Guard()
    args = {"query": "refund policy"}
    for _ in range(2):
        guard.before_tool("search_docs", args)
        guard.after_tool("search_docs", args, ToolResult.success("no results"))
    batch = [("search_docs", args), ("read_doc", {"id": 1})]
    guard.before_tools(batch)  # allowed: the 3rd search, and a read
    guard.after_tool("search_docs", args, ToolResult.success("no results"))
    with pytest.raises(LoopDetected):
        guard.before_tool("search_docs", args)  # the 4th: the stop
    # the read was running when the run stopped: it finishes, and is no activity after it
    assert guard.after_tool("read_doc", {"id": 1}, ToolResult.success("doc")) is None
    assert guard.snapshot().after_stop_tool_calls == 0
    with pytest.raises(LoopDetected):
        guard.before_tool("search_docs", args)
    assert guard.snapshot().after_stop_tool_calls == 1


# -- receipts -----------------------------------------------------------------------------


def test_receipt_takes_a_reason_and_records_wall_clock_times() -> None:
    import time

    from tripwire.core.receipt import EndKind, StopReceipt

    clock = FakeClock()
    before = time.time()
    guard = Guard(loop_policy=None, clock=clock)
    after = time.time()
    guard.before_step()
    clock.now += 5
    receipt = guard.receipt("writer", reason=StopReason.USER_CANCELLED)
    assert isinstance(receipt, StopReceipt)
    assert receipt.reason is StopReason.USER_CANCELLED and receipt.end is EndKind.USER_ABORT
    assert receipt.started_at is not None and before <= receipt.started_at <= after
    assert receipt.ended_at == pytest.approx(receipt.started_at + 5)
    assert receipt.counters.duration_s == 5


def test_receipt_of_a_finished_run_classifies_as_a_finish() -> None:
    from tripwire.core.receipt import HealthState, classify

    guard = Guard(loop_policy=None)
    guard.before_step()
    guard.finish()
    assert classify(guard.receipt("writer")).state is HealthState.FALSE_COMPLETE


def test_receipt_of_an_unfinished_run_warns_to_call_finish() -> None:
    import tripwire.guard._guard as guard_module

    guard_module._UNFINISHED_WARNED.clear()
    guard = Guard(loop_policy=None)
    guard.before_step()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        receipt = guard.receipt("writer")
    assert receipt.reason is None
    assert any("guard.finish()" in str(w.message) for w in caught)


def test_receipt_rejects_a_reason_that_is_not_a_stop_reason() -> None:
    with pytest.raises(ConfigError) as info:
        Guard(loop_policy=None).receipt("a", reason="done")  # type: ignore[arg-type]
    assert info.value.field == "reason"


# -- bad input (issue 16) -------------------------------------------------------------------


@pytest.mark.parametrize("cost", [float("nan"), float("inf"), -0.01, 1e300, True, "0.1"])
def test_record_usage_refuses_a_cost_that_is_not_a_usable_number(cost: object) -> None:
    guard = Guard(Limits(max_cost_usd=1.0), loop_policy=None)
    with pytest.raises(ConfigError) as info:
        guard.record_usage(cost_usd=cost)  # type: ignore[arg-type]
    assert info.value.field == "cost_usd"
    assert guard.snapshot().counters.cost_usd == 0


@pytest.mark.parametrize("tokens", [-1, 1.5, 10**5000, 1 << 62], ids=["neg", "float", "huge", "2**62"])
def test_record_usage_refuses_token_counts_out_of_range(tokens: object) -> None:
    guard = Guard(loop_policy=None)
    with pytest.raises(ConfigError) as info:
        guard.record_usage(input_tokens=tokens)  # type: ignore[arg-type]
    assert info.value.field == "input_tokens"


@pytest.mark.parametrize("field", ["model", "provider"])
@pytest.mark.parametrize("name", [123, ["gpt-4o"], b"gpt-4o"], ids=["int", "list", "bytes"])
def test_record_usage_refuses_a_model_or_provider_that_is_not_a_name(field: str, name: object) -> None:
    # With a cost limit and the default pricer, a non-str model reached the pricer's error
    # path, whose "<error>" + model raised a bare TypeError into the agent.
    guard = Guard(Limits(max_cost_usd=1.0), loop_policy=None)
    with pytest.raises(ConfigError) as info:
        guard.record_usage(input_tokens=5, **{field: name})  # type: ignore[arg-type]
    assert info.value.field == field
    assert guard.snapshot().counters.input_tokens == 0  # refused whole: nothing counted


def test_the_receipt_carries_activity_after_the_stop() -> None:
    from tripwire.core.receipt import AfterStop, HealthState, classify

    guard = _stopped_by_a_loop()
    clean = guard.receipt("support")
    assert clean.after_stop == AfterStop(model_calls=0, tool_calls=0)
    assert classify(clean).state is HealthState.STUCK  # a loop stop, and the run did stop
    with pytest.raises(LoopDetected):
        guard.before_step()
    with pytest.raises(LoopDetected):
        guard.before_tool("search_docs", {"query": "refund policy"})
    assert guard.after_stop == AfterStop(model_calls=1, tool_calls=1)
    receipt = guard.receipt("support")
    assert receipt.after_stop == AfterStop(model_calls=1, tool_calls=1)
    assert classify(receipt).state is HealthState.UNCERTAIN  # the run went on: no clean stop


def test_a_running_guard_has_no_after_stop() -> None:
    guard = Guard()
    guard.before_step()
    assert guard.after_stop is None


@pytest.mark.parametrize("seconds", [1e10, float("inf")])
def test_a_timeout_too_long_to_wait_for_is_no_timeout(seconds: float) -> None:
    guard = Guard(loop_policy=None)
    ran: list[str] = []

    def tool() -> str:
        ran.append(threading.current_thread().name)
        return "done"

    assert guard.timeout(tool, seconds) == "done"
    assert ran == [threading.current_thread().name]  # no worker thread was started


def test_a_tool_timeout_limit_too_long_to_wait_for_is_no_timeout() -> None:
    guard = Guard(Limits(tool_timeout_s=1e10), loop_policy=None)
    assert guard.timeout(lambda: 7) == 7


async def test_an_async_timeout_too_long_to_wait_for_is_no_timeout() -> None:
    guard = Guard(loop_policy=None)
    assert await guard.atimeout(asyncio.sleep(0, result=3), 1e10) == 3


@pytest.mark.parametrize("seconds", [float("nan"), 0, -1, True])
def test_a_timeout_that_is_not_a_positive_number_is_refused_before_the_tool_runs(
    seconds: float,
) -> None:
    guard = Guard(loop_policy=None)
    ran: list[int] = []
    with pytest.raises(ConfigError) as info:
        guard.timeout(lambda: ran.append(1), seconds)
    assert info.value.field == "seconds" and ran == []


# -- memory: bounded in bytes whatever the tool names (issue 16) ---------------------------


def test_long_tool_names_are_counted_under_clipped_names() -> None:
    a, b = "t" * 300_000 + "a", "t" * 300_000 + "b"
    guard = Guard(Limits(default_tool_cap=1), loop_policy=None)
    guard.before_tool(a, {})
    guard.before_tool(b, {})  # another tool: its own cap
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool(a, {})
    assert info.value.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL
    names = guard.snapshot().counters.tool_calls_by_tool
    assert len(names) == 2 and all(len(n) < 100 for n in names)


def test_a_run_with_huge_distinct_tool_names_keeps_bounded_memory() -> None:
    # The guard's own memory (its plans, per-tool counters and names shown); the signature
    # normalizer's caches, used when the loop watcher is on, are bounded on their own.
    import gc
    import tracemalloc

    guard = Guard(loop_policy=None)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(300):
            name = f"{i:04d}" + "x" * 100_000  # 300 distinct 100 kB names: 30 MB in all
            guard.before_tool(name, {"i": i})
            guard.after_tool(name, {"i": i}, ToolResult.success("ok"))
            del name
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert guard.snapshot().counters.tool_calls == 300
    assert kept < 3_000_000, kept  # a few names at most, not every one


@pytest.mark.parametrize(
    "call",
    [
        lambda g: g.before_tool(None, {}),
        lambda g: g.before_tool(b"search", {}),
        lambda g: g.before_tools([("a", {}), "b"]),
        lambda g: g.before_tools([(1, {}), ("b", {})]),
        lambda g: g.after_tool(7, {}),
        lambda g: g.after_tool("a", {}, "ok"),
    ],
)
def test_wrong_types_are_config_errors_not_type_errors(call: Any) -> None:
    for guard in (Guard(), Guard(loop_policy=None)):
        with pytest.raises(ConfigError):
            call(guard)
