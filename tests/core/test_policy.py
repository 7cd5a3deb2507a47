"""Loop and retry policies: defaults, validation (ConfigError names the field), derived values."""

from __future__ import annotations

import dataclasses

import pytest

from tripwire.core.policy import (
    DEFAULT_POLICY,
    SEED_POLICY,
    KeyMode,
    LoopPolicy,
    ResultEvidence,
    RetryPolicy,
)
from tripwire.errors import ConfigError

# -- LoopPolicy ------------------------------------------------------------------------------


def test_defaults_follow_the_design() -> None:
    p = LoopPolicy()
    assert (p.window, p.threshold) == (10, 4)
    assert p.key is KeyMode.TOOL_ARGS
    assert p.min_repeats == 3
    assert p.max_period is not None and p.max_period >= 3  # periods 2 and 3 are always looked for
    assert p.polling_tools == frozenset()
    assert p.require_evidence is False
    assert p.name_only == "uncertain"
    assert p.retry is None
    assert dict(p.retry_per_tool) == {}
    assert p.max_lease_renewals == 3
    assert p.confirm == 1
    assert p == DEFAULT_POLICY


def test_seed_preset_is_the_plain_repetition_rule() -> None:
    assert (SEED_POLICY.window, SEED_POLICY.threshold) == (10, 4)
    assert SEED_POLICY.max_period is None
    assert SEED_POLICY.same_error is None
    assert SEED_POLICY.revisit is None
    assert SEED_POLICY.result_evidence is ResultEvidence.OFF
    assert SEED_POLICY.name_only == "stuck"


def test_presets_by_name() -> None:
    assert LoopPolicy.preset("default") is DEFAULT_POLICY
    assert LoopPolicy.preset("seed") is SEED_POLICY
    with pytest.raises(ConfigError) as info:
        LoopPolicy.preset("paranoid")
    assert info.value.field == "preset"
    assert "default" in info.value.expected and "seed" in info.value.expected


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window": 0}, "window"),
        ({"window": -1}, "window"),
        ({"window": 2.5}, "window"),
        ({"window": True}, "window"),
        ({"threshold": 1}, "threshold"),
        ({"threshold": 11}, "threshold"),  # above the default window: could never trip
        ({"window": 5, "threshold": 6}, "threshold"),
        ({"key": "args"}, "key"),
        ({"result_evidence": "sometimes"}, "result_evidence"),
        ({"max_period": 1}, "max_period"),
        ({"max_period": 0}, "max_period"),
        ({"min_repeats": 1}, "min_repeats"),
        ({"same_error": 1}, "same_error"),
        ({"revisit": 1}, "revisit"),
        ({"revisit_memory": 0}, "revisit_memory"),
        ({"name_only": "maybe"}, "name_only"),
        ({"max_lease_renewals": -1}, "max_lease_renewals"),
        ({"confirm": 0}, "confirm"),
        ({"retry": "rate_limited"}, "retry"),
        ({"retry_per_tool": {"fetch": 3}}, "retry_per_tool['fetch']"),
    ],
)
def test_invalid_settings_raise_config_error_naming_the_field(
    kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        LoopPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert isinstance(info.value, ValueError)


def test_boundary_values_are_accepted() -> None:
    p = LoopPolicy(window=4, threshold=4, max_period=2, min_repeats=2, same_error=2, confirm=1)
    assert (p.window, p.threshold) == (4, 4)
    assert LoopPolicy(window=2, threshold=2).threshold == 2
    assert LoopPolicy(max_lease_renewals=0).max_lease_renewals == 0
    assert LoopPolicy(max_period=None).max_period is None


def test_string_values_become_enums() -> None:
    p = LoopPolicy(key="tool", result_evidence="all")  # type: ignore[arg-type]
    assert p.key is KeyMode.TOOL
    assert p.result_evidence is ResultEvidence.ALL


def test_policies_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_POLICY.threshold = 5  # type: ignore[misc]


def test_retry_table_is_copied_and_read_only() -> None:
    table = {"fetch": RetryPolicy(errors={"timeout"})}
    p = LoopPolicy(retry_per_tool=table)
    table["other"] = RetryPolicy()
    assert set(p.retry_per_tool) == {"fetch"}
    with pytest.raises(TypeError):
        p.retry_per_tool["x"] = RetryPolicy()  # type: ignore[index]


def test_version_is_stable_and_tracks_every_setting() -> None:
    assert LoopPolicy().version == LoopPolicy().version == DEFAULT_POLICY.version
    assert DEFAULT_POLICY.version.startswith("p4:default:")
    changed = {
        LoopPolicy(threshold=3).version,
        LoopPolicy(window=12).version,
        LoopPolicy(key="tool").version,  # type: ignore[arg-type]
        LoopPolicy(max_period=None).version,
        LoopPolicy(polling_tools=frozenset({"poll"})).version,
        LoopPolicy(retry=RetryPolicy(errors={"x"})).version,
        LoopPolicy(retry_per_tool={"t": RetryPolicy()}).version,
        LoopPolicy(confirm=2).version,
    }
    assert DEFAULT_POLICY.version not in changed
    assert len(changed) == 8
    assert LoopPolicy(name="mine").version.startswith("p4:mine:")


def test_evolve_validates_again() -> None:
    p = DEFAULT_POLICY.evolve(threshold=3)
    assert p.threshold == 3
    assert p.version != DEFAULT_POLICY.version
    with pytest.raises(ConfigError) as info:
        DEFAULT_POLICY.evolve(threshold=1)
    assert info.value.field == "threshold"


def test_retry_for_prefers_the_tool_entry() -> None:
    everywhere = RetryPolicy(errors={"timeout"})
    fetch = RetryPolicy(errors={"rate_limited"})
    p = LoopPolicy(retry=everywhere, retry_per_tool={"fetch": fetch})
    assert p.retry_for("fetch") is fetch
    assert p.retry_for("search") is everywhere
    assert LoopPolicy(retry_per_tool={"fetch": fetch}).retry_for("search") is None


def test_result_evidence_modes() -> None:
    polling = LoopPolicy.with_polling(["check_status"], result_evidence="polling")
    assert polling.result_is_evidence("check_status")
    assert not polling.result_is_evidence("search")
    assert LoopPolicy(result_evidence="all").result_is_evidence("search")  # type: ignore[arg-type]
    off = LoopPolicy(result_evidence="off", polling_tools=frozenset({"check_status"}))  # type: ignore[arg-type]
    assert not off.result_is_evidence("check_status")


# -- RetryPolicy -----------------------------------------------------------------------------


def test_retry_policy_defaults() -> None:
    r = RetryPolicy()
    assert r.errors == frozenset()
    assert r.retryable_flag is True
    assert r.max_attempts == 3
    assert (r.interval_s, r.backoff_rate, r.tolerance_s) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_attempts": 0}, "RetryPolicy.max_attempts"),
        ({"max_attempts": True}, "RetryPolicy.max_attempts"),
        ({"interval_s": -1}, "RetryPolicy.interval_s"),
        ({"interval_s": float("nan")}, "RetryPolicy.interval_s"),
        ({"tolerance_s": -0.1}, "RetryPolicy.tolerance_s"),
        ({"backoff_rate": 0.5}, "RetryPolicy.backoff_rate"),
        ({"backoff_rate": float("nan")}, "RetryPolicy.backoff_rate"),
    ],
)
def test_invalid_retry_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_retry_policy_errors_accept_any_iterable() -> None:
    assert RetryPolicy(errors={"a"}).errors == frozenset({"a"})  # type: ignore[arg-type]


def test_covers() -> None:
    r = RetryPolicy(errors={"rate_limited"})
    assert r.covers("rate_limited", None)
    assert r.covers("rate_limited", True)
    assert not r.covers("rate_limited", False)  # explicitly non-retryable wins
    assert not r.covers("bad_request", None)
    assert r.covers("bad_request", True)  # the emitter's retryable flag
    assert not r.covers(None, None)
    assert r.covers(None, True)
    strict = RetryPolicy(errors={"rate_limited"}, retryable_flag=False)
    assert not strict.covers("bad_request", True)
    assert strict.covers("rate_limited", True)


def test_schedule_of_minimum_gaps() -> None:
    r = RetryPolicy(errors={"rate_limited"}, interval_s=2, backoff_rate=2, max_attempts=4)
    assert r.min_gap_s(1) == 0.0
    assert r.min_gap_s(2) == 2.0
    assert r.min_gap_s(3) == 4.0
    assert r.min_gap_s(4) == 8.0
    tolerant = RetryPolicy(interval_s=2, backoff_rate=2, tolerance_s=0.5)
    assert tolerant.min_gap_s(3) == 3.5


@pytest.mark.parametrize("value", [0, -0.5, 1.5, True, "0.8"])
@pytest.mark.parametrize("name", ["revisit_share", "failure_share"])
def test_shares_are_validated(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        LoopPolicy(**{name: value})
    assert info.value.field == name


def test_share_count_rounds_up_with_a_floor_of_two() -> None:
    assert LoopPolicy().share_count(0.8) == 8
    assert LoopPolicy(window=5).share_count(0.8) == 4
    assert LoopPolicy(window=7).share_count(0.7) == 5
    assert LoopPolicy(window=4).share_count(0.1) == 2
    assert LoopPolicy().share_count(1) == 10


def test_seed_preset_has_the_calibrated_extras_off() -> None:
    seed = LoopPolicy.preset("seed")
    assert (seed.revisit_share, seed.failure_share) == (None, None)
