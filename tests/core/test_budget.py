"""The pure budget core: limits, levels, and checks at limit-1 / limit / limit+1."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tripwire.core.budget import (
    OK,
    Level,
    Levels,
    Limits,
    Messages,
    RunCounters,
    Stop,
    check_before_step,
    check_before_tool_calls,
    check_duplicates,
    check_duration,
    check_usage,
    count_advisory,
    plan_tool_calls,
    usage_advisory,
)
from tripwire.core.reasons import StopReason
from tripwire.errors import ConfigError

# -- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_steps": -1}, "max_steps"),
        ({"max_steps": True}, "max_steps"),
        ({"max_tool_calls": 1.5}, "max_tool_calls"),
        ({"max_total_tokens": 0}, "max_total_tokens"),
        ({"max_cost_usd": 0}, "max_cost_usd"),
        ({"max_cost_usd": float("nan")}, "max_cost_usd"),
        ({"max_duration_s": -3}, "max_duration_s"),
        ({"max_no_progress_steps": 0}, "max_no_progress_steps"),
        ({"tool_caps": {"send_email": -1}}, "tool_caps['send_email']"),
        ({"tool_caps": {"": 1}}, "tool_caps"),
        ({"levels": "strict"}, "levels"),
    ],
)
def test_invalid_limits_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Limits(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"advise": 1.0}, "Levels.advise"),
        ({"advise": 0.95, "restrict": 0.9}, "Levels.advise"),
        ({"restrict": 0}, "Levels.restrict"),
        ({"step_advise": 0, "step_restrict": 1}, "Levels.step_advise"),
        ({"step_restrict": -1}, "Levels.step_restrict"),
    ],
)
def test_invalid_levels(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Levels(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_message_templates_are_checked_and_replaceable() -> None:
    with pytest.raises(ConfigError) as info:
        Messages(advise="{budget} left")
    assert info.value.field == "Messages.advise"
    limits = Limits(max_steps=5, messages=Messages(advise="LEFT={remaining} of {limit}"))
    adv = check_before_step(limits, RunCounters(steps=2))
    assert isinstance(adv, type(OK))
    assert adv.message == "LEFT=2 of 5"


def test_tool_caps_are_frozen_and_limits_are_values() -> None:
    caps = {"send_email": 1}
    limits = Limits(tool_caps=caps)
    caps["send_email"] = 5
    assert limits.tool_caps["send_email"] == 1
    with pytest.raises(TypeError):
        limits.tool_caps["x"] = 1  # type: ignore[index]
    assert dataclasses.replace(limits, max_steps=3).max_steps == 3
    assert Limits(max_steps=3) == Limits(max_steps=3)


def test_fast_paths() -> None:
    assert not Limits().has_limits()
    assert Limits(max_steps=1).has_limits()
    assert not Limits(max_steps=1).has_tool_limits()
    assert Limits(tool_caps={"a": 1}).has_tool_limits()
    assert Limits(max_cost_usd=1.0).has_usage_limits()
    assert not Limits(max_tool_calls=3).has_usage_limits()


# -- steps --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps_done", "expected"),
    [
        (0, Level.OK),  # step 1 of 5: 4 left after it
        (1, Level.OK),  # step 2: 3 left
        (2, Level.ADVISE),  # step 3: 2 left (two steps before the end)
        (3, Level.ADVISE),  # step 4: 1 left
        (4, Level.RESTRICT),  # step 5: the last step
    ],
)
def test_step_schedule(steps_done: int, expected: Level) -> None:
    result = check_before_step(Limits(max_steps=5), RunCounters(steps=steps_done))
    assert not isinstance(result, Stop)
    assert result.level is expected


def test_step_limit_minus_one_limit_plus_one() -> None:
    limits = Limits(max_steps=3)
    assert not isinstance(check_before_step(limits, RunCounters(steps=1)), Stop)  # step 2
    assert not isinstance(check_before_step(limits, RunCounters(steps=2)), Stop)  # step 3
    stop = check_before_step(limits, RunCounters(steps=3))  # step 4
    assert isinstance(stop, Stop)
    assert (stop.reason, stop.limit_name, stop.limit, stop.observed) == (
        StopReason.MAX_STEPS,
        "max_steps",
        3,
        4,
    )
    assert stop.condition == {"steps": 3, "requested": 1, "max_steps": 3}
    assert stop.message.startswith("The next step would exceed max_steps=3")


def test_restrict_message_says_answer_without_tools() -> None:
    result = check_before_step(Limits(max_steps=2), RunCounters(steps=1))
    assert not isinstance(result, Stop)
    assert result.level is Level.RESTRICT
    assert result.message == "this is the last step: answer now from what you have, without tools."
    assert result.remaining == 0


# -- tool calls ---------------------------------------------------------------------------


def _batch(*tools: str) -> list[tuple[str, int]]:
    return [(t, hash((t, i))) for i, t in enumerate(tools)]


@pytest.mark.parametrize(("used", "refused"), [(1, False), (2, False), (3, True)])
def test_max_tool_calls_at_limit(used: int, refused: bool) -> None:
    # a cap of 3: with `used` calls done, is one more refused?
    stop = check_before_tool_calls(
        Limits(max_tool_calls=3), RunCounters(tool_calls=used), _batch("search")
    )
    assert (stop is not None) is refused
    if stop is not None:
        assert stop.reason is StopReason.MAX_TOOL_CALLS
        assert (stop.used, stop.observed) == (3, 4)


@pytest.mark.parametrize(("used", "refused"), [(0, False), (1, True)])
def test_per_tool_cap(used: int, refused: bool) -> None:
    counters = RunCounters(tool_calls=used, tool_calls_by_tool={"send_email": used})
    stop = check_before_tool_calls(
        Limits(tool_caps={"send_email": 1}), counters, _batch("send_email")
    )
    assert (stop is not None) is refused
    if stop is not None:
        assert stop.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL
        assert stop.limit_name == "tool_caps['send_email']"
        assert stop.tool == "send_email"


def test_default_cap_applies_to_unlisted_tools_only() -> None:
    limits = Limits(tool_caps={"search": 5}, default_tool_cap=1)
    counters = RunCounters(tool_calls=2, tool_calls_by_tool={"search": 1, "fetch": 1})
    assert check_before_tool_calls(limits, counters, _batch("search")) is None
    stop = check_before_tool_calls(limits, counters, _batch("fetch"))
    assert stop is not None and stop.limit_name == "default_tool_cap"


def test_zero_cap_forbids_a_tool() -> None:
    stop = check_before_tool_calls(Limits(tool_caps={"rm": 0}), RunCounters(), _batch("rm"))
    assert stop is not None and stop.limit == 0 and stop.observed == 1


def test_batch_is_checked_as_a_whole() -> None:
    limits = Limits(max_tool_calls=5)
    counters = RunCounters(tool_calls=3)
    assert check_before_tool_calls(limits, counters, _batch("a", "b")) is None
    stop = check_before_tool_calls(limits, counters, _batch("a", "b", "c"))
    assert stop is not None
    assert (stop.used, stop.observed) == (3, 6)
    assert stop.message.startswith("The next batch of 3 tool calls would exceed")


def test_per_tool_cap_wins_over_total_when_both_fire() -> None:
    limits = Limits(max_tool_calls=1, tool_caps={"send_email": 1})
    counters = RunCounters(tool_calls=1, tool_calls_by_tool={"send_email": 1})
    stop = check_before_tool_calls(limits, counters, _batch("send_email"))
    assert stop is not None and stop.reason is StopReason.MAX_TOOL_CALLS_FOR_TOOL


@pytest.mark.parametrize(("done", "refused"), [(1, False), (2, True)])
def test_duplicates(done: int, refused: bool) -> None:
    stop = check_duplicates(Limits(max_duplicate_calls=2), {42: done}, [("search", 42)])
    assert (stop is not None) is refused
    if stop is not None:
        assert stop.reason is StopReason.MAX_DUPLICATE_CALLS and stop.observed == 3


def test_duplicates_within_one_batch() -> None:
    stop = check_duplicates(Limits(max_duplicate_calls=1), {}, [("s", 7), ("s", 7)])
    assert stop is not None and stop.observed == 2


def test_count_advisory_levels() -> None:
    limits = Limits(max_tool_calls=10)
    charge = plan_tool_calls(limits, ["search"])[-1]
    assert count_advisory(limits, charge, 7) is None
    adv = count_advisory(limits, charge, 8)
    assert adv is not None and adv.level is Level.ADVISE and adv.remaining == 2
    assert adv.message == "2 of 10 tool calls left: start wrapping up."
    last = count_advisory(limits, charge, 10)
    assert last is not None and last.remaining == 0 and last.level is Level.ADVISE


# -- usage and time ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "reason"),
    [(999, None), (1000, StopReason.MAX_TOTAL_TOKENS), (1001, StopReason.MAX_TOTAL_TOKENS)],
)
def test_total_tokens_stop_at_or_above_the_limit(tokens: int, reason: StopReason | None) -> None:
    stop = check_usage(
        Limits(max_total_tokens=1000), RunCounters(input_tokens=tokens - 100, output_tokens=100)
    )
    assert (stop.reason if stop else None) is reason
    if stop is not None:
        assert stop.observed == tokens
        assert stop.message.startswith("Reached" if tokens == 1000 else "Exceeded")


@pytest.mark.parametrize(
    ("field", "counter", "reason"),
    [
        ("max_input_tokens", "input_tokens", StopReason.MAX_INPUT_TOKENS),
        ("max_output_tokens", "output_tokens", StopReason.MAX_OUTPUT_TOKENS),
    ],
)
@pytest.mark.parametrize(("value", "fires"), [(49, False), (50, True), (51, True)])
def test_input_output_tokens(
    field: str, counter: str, reason: StopReason, value: int, fires: bool
) -> None:
    stop = check_usage(Limits(**{field: 50}), RunCounters(**{counter: value}))  # type: ignore[arg-type]
    assert (stop is not None) is fires
    if stop is not None:
        assert stop.reason is reason and stop.limit_name == field


@pytest.mark.parametrize(("cost", "fires"), [(0.49, False), (0.5, True), (0.51, True)])
def test_cost(cost: float, fires: bool) -> None:
    stop = check_usage(Limits(max_cost_usd=0.5), RunCounters(cost_usd=cost))
    assert (stop is not None) is fires
    if stop is not None:
        assert stop.reason is StopReason.MAX_COST and "$0.50" in stop.message


@pytest.mark.parametrize(
    ("cost", "level"),
    [(0.39, Level.OK), (0.40, Level.ADVISE), (0.44, Level.ADVISE), (0.45, Level.RESTRICT)],
)
def test_cost_levels(cost: float, level: Level) -> None:
    adv = usage_advisory(Limits(max_cost_usd=0.5), RunCounters(cost_usd=cost))
    assert adv.level is level
    if level is Level.ADVISE:
        assert adv.message.startswith("about $0.")
        assert adv.message.endswith("of the $0.50 budget left: start wrapping up.")


@pytest.mark.parametrize(("elapsed", "fires"), [(9.99, False), (10.0, True), (10.01, True)])
def test_duration(elapsed: float, fires: bool) -> None:
    stop = check_duration(Limits(max_duration_s=10), elapsed)
    assert (stop is not None) is fires
    if stop is not None:
        assert stop.reason is StopReason.MAX_DURATION


def test_before_step_order_deadline_first() -> None:
    # A timeout at step 4 is a timeout even if the step cap was also reached.
    limits = Limits(max_steps=3, max_duration_s=5)
    stop = check_before_step(limits, RunCounters(steps=3, elapsed_s=6))
    assert isinstance(stop, Stop) and stop.reason is StopReason.MAX_DURATION


@pytest.mark.parametrize(("streak", "fires"), [(1, False), (2, False), (3, True)])
def test_no_progress(streak: int, fires: bool) -> None:
    result = check_before_step(
        Limits(max_no_progress_steps=3), RunCounters(no_progress_steps=streak)
    )
    assert isinstance(result, Stop) is fires
    if isinstance(result, Stop):
        assert result.reason is StopReason.NO_PROGRESS and result.used == 3


def test_before_step_sees_usage_already_spent() -> None:
    stop = check_before_step(Limits(max_cost_usd=1.0), RunCounters(cost_usd=1.2))
    assert isinstance(stop, Stop) and stop.reason is StopReason.MAX_COST


# -- properties ---------------------------------------------------------------------------


@given(cap=st.integers(0, 50), used=st.integers(0, 60), batch=st.integers(1, 10))
def test_tool_cap_property(cap: int, used: int, batch: int) -> None:
    stop = check_before_tool_calls(
        Limits(max_tool_calls=cap), RunCounters(tool_calls=used), _batch(*["t"] * batch)
    )
    assert (stop is None) == (used + batch <= cap)


@given(cap=st.integers(1, 40))
def test_a_cap_of_n_allows_exactly_n(cap: int) -> None:
    limits = Limits(max_tool_calls=cap)
    used = 0
    while check_before_tool_calls(limits, RunCounters(tool_calls=used), _batch("t")) is None:
        used += 1
        assert used <= cap
    assert used == cap


@given(limit=st.integers(1, 10**6), used=st.integers(0, 2 * 10**6))
def test_tokens_stop_iff_at_or_above(limit: int, used: int) -> None:
    stop = check_usage(Limits(max_output_tokens=limit), RunCounters(output_tokens=used))
    assert (stop is not None) == (used >= limit)


@given(max_steps=st.integers(1, 30), done=st.integers(0, 40))
def test_steps_property(max_steps: int, done: int) -> None:
    result = check_before_step(Limits(max_steps=max_steps), RunCounters(steps=done))
    if done + 1 > max_steps:
        assert isinstance(result, Stop)
    else:
        assert not isinstance(result, Stop)
        left = max_steps - done - 1
        expected = Level.RESTRICT if left == 0 else Level.ADVISE if left <= 2 else Level.OK
        assert result.level is expected


@given(frac=st.floats(0, 2, allow_nan=False))
def test_levels_are_monotone(frac: float) -> None:
    limits = Limits(max_total_tokens=1000)
    adv = usage_advisory(limits, RunCounters(input_tokens=int(frac * 1000)))
    rank = {Level.OK: 0, Level.ADVISE: 1, Level.RESTRICT: 2}
    more = usage_advisory(limits, RunCounters(input_tokens=int(frac * 1000) + 50))
    if check_usage(limits, RunCounters(input_tokens=int(frac * 1000) + 50)) is None:
        assert rank[more.level] >= rank[adv.level]
