"""Hypothesis properties of the core: signature invariants, hostile input, rule oracles."""

from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tripwire.core.events import ToolCall
from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import ArgsKind, Rule, Verdict
from tripwire.core.signature import (
    DEFAULT_NORMALIZER,
    DEFAULT_VOLATILE_KEYS,
    Signature,
    signature_of,
)
from tripwire.core.watch import RunState, evaluate
from tripwire.detector import LoopDetector
from tripwire.errors import LoopDetected

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies --------------------------------------------------------------------------------

keys = st.text(min_size=1, max_size=8).filter(lambda k: k not in DEFAULT_VOLATILE_KEYS)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=25,
)
json_objects = st.dictionaries(keys, json_values, max_size=5)

hostile_scalars = (
    scalars
    | st.floats()  # NaN, infinities
    | st.binary(max_size=16)
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3)
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=8) | st.integers(), children, max_size=4),
    max_leaves=30,
)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every dict's key order shuffled (at every depth)."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def with_volatile(value: Any, rnd: random.Random) -> Any:
    """The same value with volatile keys (random values) added to dicts at random depths."""
    if isinstance(value, dict):
        out = {k: with_volatile(v, rnd) for k, v in value.items()}
        for key in rnd.sample(sorted(DEFAULT_VOLATILE_KEYS), rnd.randint(0, 3)):
            out[key] = rnd.choice([rnd.random(), f"id-{rnd.random()}", {"nested": rnd.random()}, [1, 2]])
        return out
    if isinstance(value, list):
        return [with_volatile(v, rnd) for v in value]
    return value


def ints_as_floats(value: Any) -> Any:
    """The same value with every integer that a float holds exactly written as a float."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) <= 2**53:
        return float(value)
    if isinstance(value, dict):
        return {k: ints_as_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ints_as_floats(v) for v in value]
    return value


# -- signature invariants ----------------------------------------------------------------------


@SETTINGS
@given(json_objects, st.randoms(use_true_random=False))
def test_signature_invariant_under_key_order(args: dict[str, Any], rnd: random.Random) -> None:
    assert signature_of("t", shuffled(args, rnd)) == signature_of("t", args)


@SETTINGS
@given(json_objects, st.randoms(use_true_random=False))
def test_signature_invariant_under_volatile_keys_at_any_depth(args: dict[str, Any], rnd: random.Random) -> None:
    noisy = with_volatile(args, rnd)
    assert signature_of("t", noisy) == signature_of("t", args)
    text = json.dumps(noisy)
    if len(text.encode()) <= DEFAULT_NORMALIZER.max_bytes:
        assert signature_of("t", text) == signature_of("t", args)


@SETTINGS
@given(json_objects)
def test_json_string_equals_dict(args: dict[str, Any]) -> None:
    text = json.dumps(args)
    if len(text.encode()) <= DEFAULT_NORMALIZER.max_bytes:
        assert signature_of("t", text) == signature_of("t", args)
        assert signature_of("t", json.dumps(args, ensure_ascii=False, indent=1)) == signature_of("t", args)


@SETTINGS
@given(json_objects)
def test_integral_floats_equal_integers(args: dict[str, Any]) -> None:
    assert signature_of("t", ints_as_floats(args)) == signature_of("t", args)


@SETTINGS
@given(st.integers(min_value=2**64, max_value=2**200), st.integers(min_value=1, max_value=2**20))
def test_distinct_big_integers_differ(n: int, delta: int) -> None:
    assert signature_of("t", f'{{"n": {n}}}') != signature_of("t", f'{{"n": {n + delta}}}')
    assert signature_of("t", {"n": n}) != signature_of("t", {"n": n + delta})


# -- hostile input always gets an answer --------------------------------------------------------


@SETTINGS
@given(hostile_values)
def test_any_value_gets_a_deterministic_signature(value: Any) -> None:
    s = signature_of("t", value)
    assert isinstance(s, Signature)
    assert s == signature_of("t", value)


@SETTINGS
@given(st.text(max_size=200) | st.binary(max_size=200))
def test_any_text_gets_a_signature(text: str | bytes) -> None:
    s = signature_of("t", text)
    assert s.kind in (ArgsKind.JSON, ArgsKind.TEXT, ArgsKind.ABSENT)
    assert s == signature_of("t", text)


@SETTINGS
@given(hostile_values)
def test_json_text_of_any_value_gets_a_signature(value: Any) -> None:
    try:
        text = json.dumps(value, default=repr)
    except (TypeError, ValueError):
        return
    assert isinstance(signature_of("t", text), Signature)


# -- rules -------------------------------------------------------------------------------------

policies = st.builds(
    lambda window, threshold, max_period, min_repeats: LoopPolicy(
        window=window,
        threshold=min(threshold, window),
        max_period=max_period,
        min_repeats=min_repeats,
    ),
    st.integers(2, 20),
    st.integers(2, 20),
    st.none() | st.integers(2, 8),
    st.integers(2, 4),
)


@SETTINGS
@given(policies, st.lists(st.integers(), unique=True, max_size=60))
def test_no_trip_when_every_signature_is_distinct(policy: LoopPolicy, ids: list[int]) -> None:
    state = RunState.new(policy)
    for n in ids:
        evaluate(state, ToolCall(tool="t", arguments={"n": n}), policy, DEFAULT_NORMALIZER)
        assert state.current is not None
        assert state.current.verdict is Verdict.WORKING
        assert state.current.rule is None


def period_oracle(seq: list[str], max_period: int, min_repeats: int) -> tuple[int, int] | None:
    """(period, repeats) of the shortest cycle the trailing calls form, by brute force.

    A cycle of period p (2..max_period) repeated r >= min_repeats times: the last p * r calls
    are r copies of the last p calls, and those p calls are not one call repeated.
    """
    for p in range(2, max_period + 1):
        unit = seq[-p:]
        if len(unit) < p or len(set(unit)) == 1:
            continue
        r = 0
        while len(seq) >= (r + 1) * p and seq[len(seq) - (r + 1) * p : len(seq) - r * p] == unit:
            r += 1
        if r >= min_repeats:
            return p, r
    return None


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from("ABC"), max_size=30),
    st.integers(2, 5),
    st.integers(2, 4),
)
def test_period_rule_agrees_with_a_brute_force_oracle(seq: list[str], max_period: int, min_repeats: int) -> None:
    # threshold > len(seq): the repetition rule cannot fire, only the period rule can.
    detector = LoopDetector(window=40, threshold=40, max_period=max_period, min_repeats=min_repeats)
    for i, s in enumerate(seq, 1):
        expected = period_oracle(seq[:i], max_period, min_repeats)
        try:
            detector.observe(s, {"arg": s})
        except LoopDetected as exc:
            assert exc.rule is Rule.PERIOD
            assert (exc.period, exc.hits) == expected, (seq[:i], exc.period, exc.hits)
        else:
            assert expected is None, (seq[:i], expected)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from("ABCDE"), max_size=40),
    st.integers(2, 12),
    st.integers(2, 12),
)
def test_repetition_rule_agrees_with_a_counting_oracle(seq: list[str], window: int, threshold: int) -> None:
    threshold = min(threshold, window)
    detector = LoopDetector(window=window, threshold=threshold, max_period=None)
    recent: deque[str] = deque(maxlen=window)
    for s in seq:
        recent.append(s)
        hits = recent.count(s)
        try:
            detector.observe(s, {"arg": s})
        except LoopDetected as exc:
            assert exc.rule is Rule.REPETITION
            assert exc.hits == hits >= threshold
        else:
            assert hits < threshold


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 12)), max_size=8),
    st.integers(1, 6),
)
def test_period_runs_agree_with_their_definition(blocks: list[tuple[str, int]], max_period: int) -> None:
    # Stretches of one call repeated (longer than max_period, where a repeat changes nothing in
    # the state) alternating with other calls: after every call, calls - runs[p] is the number
    # of trailing positions i with key[i] == key[i - p], for each period with a run.
    seq = [s for s, n in blocks for _ in range(n)]
    policy = LoopPolicy(window=4, threshold=4, max_period=max_period if max_period >= 2 else None)
    state = RunState.new(policy)
    for i, s in enumerate(seq, 1):
        evaluate(state, ToolCall(tool=s), policy, DEFAULT_NORMALIZER)
        expected: dict[int, int] = {}
        for p in range(1, (policy.max_period or 1) + 1):
            run = 0
            while i - 1 - run - p >= 0 and seq[i - 1 - run] == seq[i - 1 - run - p]:
                run += 1
            if run:
                expected[p] = run
        assert {p: state.calls - start for p, start in state.runs.items()} == expected, seq[:i]
