"""``preview``: the verdict a call would get before it runs, without touching the run's state."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core.events import ToolCall
from tripwire.core.policy import DEFAULT_POLICY, KeyMode, LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Signature, signature_of
from tripwire.core.watch import Assessment, RunState, evaluate, preview

QUERY = {"query": "refund policy"}


def fields(state: RunState) -> dict[str, Any]:
    """Every slot of ``state``, deep-copied (so a later change to the state cannot leak in)."""
    return {name: copy.deepcopy(getattr(state, name)) for name in RunState.__slots__}


def search(result: str | None) -> ToolCall:
    return ToolCall(tool="search_docs", arguments=QUERY, result_digest=result)


def test_the_fourth_identical_call_with_the_same_result_is_stuck_before_it_runs() -> None:
    state = RunState.new(DEFAULT_POLICY)
    sig = signature_of("search_docs", QUERY)
    for _ in range(3):
        assert preview(state, "search_docs", sig, DEFAULT_POLICY, DEFAULT_NORMALIZER) is None
        evaluate(state, search("same"), DEFAULT_POLICY, DEFAULT_NORMALIZER)
    before = fields(state)
    verdict = preview(state, "search_docs", sig, DEFAULT_POLICY, DEFAULT_NORMALIZER)
    assert verdict is not None
    assert (verdict.verdict, verdict.rule, verdict.hits, verdict.call_index) == (
        Verdict.STUCK, Rule.REPETITION, 4, 4,
    )
    assert fields(state) == before  # nothing recorded: the call has not run
    assert state.calls == 3


def test_three_different_results_are_new_evidence_so_no_refusal() -> None:
    state = RunState.new(DEFAULT_POLICY)
    sig = signature_of("search_docs", QUERY)
    for i in range(3):
        evaluate(state, search(f"page {i}"), DEFAULT_POLICY, DEFAULT_NORMALIZER)
    before = fields(state)
    assert preview(state, "search_docs", sig, DEFAULT_POLICY, DEFAULT_NORMALIZER) is None
    assert fields(state) == before


def test_without_results_repetition_alone_decides() -> None:
    state = RunState.new(DEFAULT_POLICY)
    sig = signature_of("search_docs", QUERY)
    for _ in range(3):
        evaluate(state, search(None), DEFAULT_POLICY, DEFAULT_NORMALIZER)
    verdict = preview(state, "search_docs", sig, DEFAULT_POLICY, DEFAULT_NORMALIZER)
    assert verdict is not None and verdict.verdict is Verdict.STUCK


def test_a_retry_of_a_non_retryable_failure_is_refused_at_once() -> None:
    state = RunState.new(DEFAULT_POLICY)
    sig = signature_of("charge", {"card": 1})
    failed = ToolCall(tool="charge", arguments={"card": 1}, error_type="declined", retryable=False)
    evaluate(state, failed, DEFAULT_POLICY, DEFAULT_NORMALIZER)
    before = fields(state)
    verdict = preview(state, "charge", sig, DEFAULT_POLICY, DEFAULT_NORMALIZER)
    assert verdict is not None
    assert (verdict.verdict, verdict.rule, verdict.call_index) == (
        Verdict.STUCK, Rule.RETRY_OF_NON_RETRYABLE, 2,
    )
    assert fields(state) == before
    other = signature_of("charge", {"card": 2})
    assert preview(state, "charge", other, DEFAULT_POLICY, DEFAULT_NORMALIZER) is None


def test_a_held_stuck_verdict_is_not_a_new_trip() -> None:
    # After a trip, a different call trips nothing: the run stays stuck, but that call is not
    # the one that tripped, so the guard has nothing to refuse.
    state = RunState.new(DEFAULT_POLICY)
    for _ in range(4):
        evaluate(state, search(None), DEFAULT_POLICY, DEFAULT_NORMALIZER)
    assert state.current is not None and state.current.verdict is Verdict.STUCK
    other = signature_of("read_page", {"url": "a"})
    assert preview(state, "read_page", other, DEFAULT_POLICY, DEFAULT_NORMALIZER) is None


# -- preview agrees with evaluate ----------------------------------------------------------------

TOOLS = ("search", "read", "edit")
policies = st.sampled_from(
    [
        DEFAULT_POLICY,
        LoopPolicy(window=6, threshold=3, max_period=3),
        LoopPolicy(window=5, threshold=2, same_result=3, revisit=2, revisit_share=0.6, failure_share=0.6),
        LoopPolicy(key=KeyMode.TOOL, window=8, threshold=4),
        LoopPolicy(confirm=2),
        LoopPolicy(require_evidence=True),
    ]
)
steps = st.lists(
    st.tuples(
        st.sampled_from(TOOLS),
        st.integers(0, 2),  # arguments
        st.sampled_from([None, "r0", "r1", "same"]),  # the result this call gets
        st.sampled_from([None, None, None, "boom", "other"]),  # its error
        st.sampled_from([None, None, False, True]),  # retryable
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=policies, run=steps, probe=st.tuples(st.sampled_from(TOOLS), st.integers(0, 2)))
def test_preview_agrees_with_evaluate(policy: LoopPolicy, run: list[Any], probe: tuple[str, int]) -> None:
    state = RunState.new(policy)
    # What the probe's call gets if made now: the result of the last call with its key inside
    # the window (worked out here from the calls, not from the state).
    history: list[tuple[int, str | None]] = []

    def key_of(sig: Signature) -> int:
        return sig.key if policy.key is KeyMode.TOOL_ARGS else DEFAULT_NORMALIZER.tool_signature(sig.tool).key

    for position, (tool, arg, result, error, retryable) in enumerate([*run, (*probe, None, None, None)]):
        sig = signature_of(tool, {"a": arg})
        is_probe = position == len(run)
        if is_probe:
            recent = history[-policy.window + 1 :] if policy.window > 1 else []
            result = next((r for k, r in reversed(recent) if k == key_of(sig)), None)
        before = fields(state)
        verdict = preview(state, tool, sig, policy, DEFAULT_NORMALIZER)
        assert fields(state) == before
        call = ToolCall(
            tool=tool, arguments={"a": arg}, result_digest=result,
            error_type=None if is_probe else error,
            retryable=None if is_probe or (error is None and retryable is not False) else retryable,
        )
        evaluate(state, call, policy, DEFAULT_NORMALIZER, signature=sig)
        history.append((key_of(sig), result))
        current = state.current
        tripped_stuck = (
            current is not None and current.verdict is Verdict.STUCK and current.call_index == state.calls
        )
        # Whenever the call succeeds with the result preview assumed, the two must agree.
        assumed = error is None and retryable is None and result == _assumed(history[:-1], key_of(sig), policy.window)
        if is_probe or assumed:
            assert (verdict is not None) == tripped_stuck, (position, verdict, current)
            if verdict is not None:
                assert isinstance(verdict, Assessment) and verdict == current


def _assumed(history: list[tuple[int, str | None]], key: int, window: int) -> str | None:
    recent = history[-window + 1 :] if window > 1 else []
    return next((r for k, r in reversed(recent) if k == key), None)
