"""The two stateful shells: LoopDetector (raises) and LoopWatcher (verdict changes)."""

from __future__ import annotations

import pytest

from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, KeyMode, LoopPolicy
from tripwire.core.reasons import Rule, StopReason, Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, signature_of
from tripwire.detector import LoopDetector, LoopWatcher
from tripwire.errors import ConfigError, LoopDetected
from tripwire.testing import symbols


def raised_at(detector: LoopDetector, pattern: str | list[str]) -> list[tuple[int, Rule, int, int]]:
    """(call index, rule, period, hits) of every call at which ``observe`` raised."""
    out: list[tuple[int, Rule, int, int]] = []
    for s in symbols(pattern):
        try:
            detector.observe(s, {"arg": s})
        except LoopDetected as exc:
            out.append((exc.call_index, exc.rule, exc.period, exc.hits))
    return out


# -- LoopDetector ------------------------------------------------------------------------------


def test_four_identical_calls_raise_at_the_fourth() -> None:
    d = LoopDetector()
    for _ in range(3):
        d.observe("search_docs", {"query": "refund policy"})
    with pytest.raises(LoopDetected) as info:
        d.observe("search_docs", {"query": "refund policy"})
    exc = info.value
    assert exc.rule is Rule.REPETITION
    assert (exc.tool, exc.hits, exc.window, exc.period, exc.call_index) == ("search_docs", 4, 10, 1, 4)
    assert exc.digest == signature_of("search_docs", {"query": "refund policy"}).digest
    assert exc.reason is StopReason.LOOP_DETECTED
    assert "refund" not in str(exc)


def test_it_keeps_raising_while_the_rule_holds() -> None:
    d = LoopDetector()
    assert raised_at(d, "AAAAA") == [(4, Rule.REPETITION, 1, 4), (5, Rule.REPETITION, 1, 5)]
    # A different call does not trip, so it does not raise.
    assert raised_at(d, "B") == []


def test_eighty_distinct_calls_never_raise() -> None:
    d = LoopDetector()
    for i in range(80):
        d.observe("search", {"q": i})
    assert d.calls == 80


def test_search_read_oscillation_raises_at_six() -> None:
    assert raised_at(LoopDetector(), ["search", "read"] * 3) == [(6, Rule.PERIOD, 2, 3)]


def test_abc_cycle_raises_at_nine() -> None:
    assert raised_at(LoopDetector(), "ABC" * 3) == [(9, Rule.PERIOD, 3, 3)]


def test_abab_c_abab_raises_only_by_repetition() -> None:
    assert raised_at(LoopDetector(), "ABABCABAB") == [
        (8, Rule.REPETITION, 1, 4),
        (9, Rule.REPETITION, 1, 4),
    ]
    assert raised_at(LoopDetector(window=10, threshold=10), "ABABCABAB") == []


def test_window_edges() -> None:
    # 4th X as call 10 (inside the window) vs as call 11 (outside).
    assert raised_at(LoopDetector(), "XXX" + "abcdef" + "X") == [(10, Rule.REPETITION, 1, 4)]
    assert raised_at(LoopDetector(), "XXX" + "abcdefg" + "X") == []


def test_key_tool_accepts_a_string() -> None:
    d = LoopDetector(key="tool")
    assert d.policy.key is KeyMode.TOOL
    for i in range(3):
        d.observe("search", {"q": i})
    with pytest.raises(LoopDetected):
        d.observe("search", {"q": 3})


def test_name_only_calls_raise() -> None:
    d = LoopDetector()
    for _ in range(3):
        d.observe("search")
    with pytest.raises(LoopDetected):
        d.observe("search")


def test_period_rule_can_be_switched_off() -> None:
    assert raised_at(LoopDetector(max_period=None), "ABABAB") == []
    assert raised_at(LoopDetector(min_repeats=2, threshold=10), "ABAB") == [(4, Rule.PERIOD, 2, 2)]


def test_volatile_keys_of_a_custom_normalizer() -> None:
    d = LoopDetector(normalizer=DEFAULT_NORMALIZER.with_volatile_keys(add={"page_token"}))
    for i in range(3):
        d.observe("list", {"page_token": i})
    with pytest.raises(LoopDetected):
        d.observe("list", {"page_token": 99})


def test_reset_forgets_every_call() -> None:
    d = LoopDetector()
    raised_at(d, "AAA")
    d.reset()
    assert d.calls == 0
    assert raised_at(d, "AAA") == []


def test_invalid_settings_raise_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        LoopDetector(threshold=1)
    assert info.value.field == "threshold"
    with pytest.raises(ConfigError):
        LoopDetector(window=3, threshold=4)


def test_policy_exposes_the_version() -> None:
    assert LoopDetector().policy.version.startswith("p4:detector:")
    assert LoopDetector().policy.version == LoopDetector().policy.version
    assert LoopDetector(threshold=3).policy.version != LoopDetector().policy.version


# -- LoopWatcher -------------------------------------------------------------------------------


def test_watcher_reports_only_verdict_changes() -> None:
    w = LoopWatcher()
    assert w.verdict is Verdict.WORKING
    assert w.current is None
    first = w.observe(ToolCall(tool="search_docs", arguments={"query": "refund policy"}))
    assert first is not None and first.verdict is Verdict.WORKING
    assert w.observe(ToolCall(tool="search_docs", arguments={"query": "refund policy"})) is None
    assert w.observe(ToolCall(tool="search_docs", arguments={"query": "refund policy"})) is None
    stuck = w.observe(ToolCall(tool="search_docs", arguments={"query": "refund policy"}))
    assert stuck is not None and stuck.verdict is Verdict.STUCK
    assert w.observe(ToolCall(tool="search_docs", arguments={"query": "refund policy"})) is None
    assert w.verdict is Verdict.STUCK
    assert w.current is not None and w.current.call_index == 5
    assert w.calls == 5


def test_watcher_call_shorthand_and_run_lease() -> None:
    w = LoopWatcher()
    w.set_lease(Lease(owner="alice", deadline_s=100.0))
    for t in range(1, 5):
        w.call("check_approval", {"ticket": 7}, end_s=float(t))
    assert w.verdict is Verdict.WAITING
    w.set_lease(None)
    assert w.state.lease is None


def test_watcher_now_s_judges_the_lease() -> None:
    w = LoopWatcher()
    lease = Lease(owner="alice", deadline_s=10.0)
    events = [w.observe(ToolCall(tool="poll", arguments={}, lease=lease), now_s=11.0) for _ in range(4)]
    assert events[3] is not None and events[3].verdict is Verdict.STUCK


def test_watcher_uses_its_policy() -> None:
    w = LoopWatcher(LoopPolicy(require_evidence=True))
    for _ in range(4):
        w.call("write_row", {"id": 1})
    assert w.verdict is Verdict.UNCERTAIN
    assert LoopWatcher().policy is DEFAULT_POLICY


def test_detector_policy_has_only_the_two_rules() -> None:
    p = LoopDetector().policy
    assert (p.max_period, p.min_repeats) == (3, 3)
    assert (p.same_error, p.same_result, p.revisit, p.revisit_share, p.failure_share) == (None,) * 5
