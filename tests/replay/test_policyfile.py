"""Policy files: versioned, strict about keys, mapped onto LoopPolicy and Normalizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tripwire.core.policy import KeyMode, LoopPolicy, ResultEvidence, RetryPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.errors import ConfigError
from tripwire.replay.policyfile import load_policy_file, parse_policy


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tripwire.toml"
    path.write_text(text)
    return path


def test_full_file(tmp_path: Path) -> None:
    pf = load_policy_file(
        _file(
            tmp_path,
            """
version = 1
preset = "default"

[policy]
window = 12
threshold = 5
key = "tool"
max_period = "off"
min_repeats = 4
same_error = 3
result_evidence = "all"
polling_tools = ["job_status"]
name_only = "stuck"
confirm = 2

[policy.retry]
errors = ["timeout"]
max_attempts = 4
interval_s = 1.5

[policy.retry_per_tool.fetch]
errors = ["http_503"]
backoff_rate = 2.0

[normalizer]
volatile_keys_add = ["cursor"]
volatile_keys_remove = ["now"]
max_bytes = 4096
""",
        )
    )
    p = pf.policy
    assert (p.window, p.threshold, p.key, p.max_period, p.min_repeats, p.same_error) == (
        12, 5, KeyMode.TOOL, None, 4, 3,
    )
    assert p.result_evidence is ResultEvidence.ALL
    assert p.polling_tools == frozenset({"job_status"})
    assert (p.name_only, p.confirm) == ("stuck", 2)
    assert p.retry == RetryPolicy(errors=frozenset({"timeout"}), max_attempts=4, interval_s=1.5)
    assert p.retry_per_tool["fetch"] == RetryPolicy(errors=frozenset({"http_503"}), backoff_rate=2.0)
    n = pf.normalizer
    assert "cursor" in n.volatile_keys and "now" not in n.volatile_keys
    assert "timestamp" in n.volatile_keys
    assert n.max_bytes == 4096
    assert pf.source.endswith("tripwire.toml")


def test_fields_left_out_keep_the_presets_values() -> None:
    pf = parse_policy({"version": 1, "preset": "seed", "policy": {"window": 20}})
    assert pf.policy == LoopPolicy.preset("seed").evolve(window=20)
    assert pf.normalizer == DEFAULT_NORMALIZER
    assert parse_policy({"version": 1}).policy == LoopPolicy.preset("default")


def test_false_turns_an_optional_rule_off_and_zero_is_invalid() -> None:
    assert parse_policy({"version": 1, "policy": {"max_period": False}}).policy.max_period is None
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "policy": {"max_period": 0}})
    assert info.value.field == "policy.max_period"


@pytest.mark.parametrize(
    "data, field",
    [
        ({"version": 1, "polcy": {}}, "polcy"),
        ({"version": 1, "policy": {"windw": 10}}, "policy.windw"),
        ({"version": 1, "policy": {"version": "x"}}, "policy.version"),
        ({"version": 1, "policy": {"retry": {"attempts": 3}}}, "policy.retry.attempts"),
        ({"version": 1, "normalizer": {"volatile_keys": ["a"]}}, "normalizer.volatile_keys"),
    ],
)
def test_unknown_keys_are_rejected_by_name(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy(data)
    assert info.value.field == field


@pytest.mark.parametrize("version", [2, 0, "1", True])
def test_unknown_versions_are_rejected(version: object) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": version})
    assert info.value.field == "version"


def test_missing_version() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"policy": {"window": 10}})
    assert info.value.field == "version"


@pytest.mark.parametrize(
    "policy, field",
    [
        ({"window": 0}, "policy.window"),
        ({"threshold": 20}, "policy.threshold"),
        ({"key": "args"}, "policy.key"),
        ({"polling_tools": "job_status"}, "policy.polling_tools"),
        ({"retry": {"max_attempts": 0}}, "policy.retry.max_attempts"),
    ],
)
def test_invalid_values_name_the_key(policy: dict, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "policy": policy})
    assert info.value.field == field


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "preset": "aggressive"})
    assert info.value.field == "preset"


def test_invalid_normalizer_cap() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "normalizer": {"max_bytes": 1}})
    assert info.value.field == "normalizer.max_bytes"


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_policy_file(tmp_path / "missing.toml")
    with pytest.raises(ConfigError) as info:
        load_policy_file(_file(tmp_path, "version = = 1"))
    assert "not valid TOML" in str(info.value)


def test_a_policy_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tripwire.toml"
    path.write_bytes("version = 1\n# réglages\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_policy_file(path)
    assert "not UTF-8" in str(info.value) and str(path) in str(info.value)


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "tripwire.toml"
    path.write_bytes(b"\xef\xbb\xbfversion = 1\n[policy]\nwindow = 12\n")
    assert load_policy_file(path).policy.window == 12


def test_a_policy_file_refuses_the_configuration_sections() -> None:
    with pytest.raises(ConfigError) as info:
        parse_policy({"version": 1, "limits": {"max_tool_calls": 3}})
    assert info.value.field == "limits" and "TRIPWIRE_CONFIG" in str(info.value)


def test_errors_name_the_file_in_the_message(tmp_path: Path) -> None:
    path = _file(tmp_path, "version = 1\n[policy]\nwindow = 0\n")
    with pytest.raises(ConfigError) as info:
        load_policy_file(path)
    assert info.value.field == "policy.window" and str(path) in str(info.value)


def test_every_optional_rule_can_be_switched_off() -> None:
    rules = ("max_period", "same_error", "same_result", "revisit", "revisit_share", "failure_share")
    pf = parse_policy({"version": 1, "policy": dict.fromkeys(rules, "off")})
    assert all(getattr(pf.policy, name) is None for name in rules)
    assert parse_policy({"version": 1, "policy": {"failure_share": 0.9}}).policy.failure_share == 0.9
