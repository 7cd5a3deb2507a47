"""The watcher's O(1) path for a run that stays stuck gives exactly the full decision."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core import watch
from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, KeyMode, LoopPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.core.watch import RunState, evaluate

policies = st.sampled_from(
    [
        DEFAULT_POLICY,
        LoopPolicy(window=100, threshold=4),
        LoopPolicy(window=5, threshold=2, require_evidence=True),
        LoopPolicy(key=KeyMode.TOOL, window=6, threshold=3),
        LoopPolicy(window=8, threshold=3, same_result=None, revisit=None, revisit_share=None),
    ]
)
calls = st.lists(
    st.builds(
        lambda tool, arg, result, progress, lease: ToolCall(
            tool=tool,
            arguments={"a": arg} if arg is not None else None,
            result_digest=result,
            progress=progress,
            lease=Lease(owner="q", deadline_s=5.0) if lease else None,
            end_s=1.0,
        ),
        st.sampled_from(["search", "read"]),
        st.sampled_from([0, 0, 1, None]),
        st.sampled_from([None, "same", "same", "other"]),
        st.sampled_from([None, None, None, "p1", "p2"]),
        st.sampled_from([False, False, False, True]),
    ),
    max_size=60,
)


def run(policy: LoopPolicy, sequence: list[ToolCall]) -> list[Any]:
    state = RunState.new(policy)
    out: list[Any] = []
    for call in sequence:
        out.append((evaluate(state, call, policy, DEFAULT_NORMALIZER), state.current))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=policies, sequence=calls, repeat=st.integers(0, 40))
def test_the_shortcut_agrees_with_the_full_decision(
    policy: LoopPolicy, sequence: list[ToolCall], repeat: int
) -> None:
    # A random run, then the same call over and over (the case the shortcut exists for).
    if sequence:
        sequence = sequence + [sequence[-1]] * repeat
    fast = run(policy, sequence)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(watch, "_still_stuck", lambda *args: None)
        full = run(policy, sequence)
    assert fast == full


def test_a_lease_in_a_stuck_run_is_still_judged() -> None:
    policy = LoopPolicy()
    state = RunState.new(policy)
    call = ToolCall(tool="poll", arguments={"job": 1}, result_digest="pending", end_s=1.0)
    for _ in range(4):
        evaluate(state, call, policy, DEFAULT_NORMALIZER)
    assert state.current is not None and state.current.verdict.value == "stuck"
    leased = ToolCall(
        tool="poll", arguments={"job": 1}, result_digest="pending", end_s=2.0,
        lease=Lease(owner="ops", deadline_s=10.0),
    )
    changed = evaluate(state, leased, policy, DEFAULT_NORMALIZER)
    assert changed is not None and changed.verdict.value == "waiting"
