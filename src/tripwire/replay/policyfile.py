"""Policy files (``tripwire.toml``): a versioned, reviewable loop policy and normalizer.

::

    version = 1                     # required; the only version so far
    preset = "default"              # optional: the preset the settings below change

    [policy]                        # any LoopPolicy field; "off" (or false) turns a rule off
    window = 10
    threshold = 4
    key = "tool+args"               # or "tool"
    max_period = 3                  # or "off"
    min_repeats = 3
    same_error = "off"              # or an integer >= 2 (likewise same_result, revisit)
    failure_share = 0.8             # or "off"; a share of the window (likewise revisit_share)
    result_evidence = "polling"     # "off", "polling" or "all"
    polling_tools = ["get_job_status"]
    require_evidence = false
    name_only = "uncertain"         # or "stuck"
    max_lease_renewals = 3
    confirm = 1

    [policy.retry]                  # a RetryPolicy for every tool
    errors = ["timeout"]
    max_attempts = 3
    interval_s = 1.0
    backoff_rate = 2.0

    [policy.retry_per_tool.fetch_page]
    errors = ["http_503"]

    [policy.polls.get_job_status]   # a declared poll: the same answer is waiting, up to max_wait_s
    interval_s = 10
    max_wait_s = 600

    [normalizer]
    volatile_keys_add = ["cursor"]
    volatile_keys_remove = ["now"]
    max_bytes = 16384

Fields left out keep the preset's values (so a tuned default in a new tripwire version
reaches files that did not pin it; pin a field to keep it). Unknown versions and unknown keys
are rejected with a :class:`~tripwire.errors.ConfigError` naming the key: a typo must not
silently give the default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from tripwire.core.policy import LoopPolicy, Poll, RetryPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "SUPPORTED_VERSIONS",
    "PolicyFile",
    "apply_overrides",
    "load_policy_file",
    "parse_policy",
]

SUPPORTED_VERSIONS: Final = (1,)
"""Policy file versions this tripwire reads."""

_TOP_KEYS: Final = ("version", "preset", "policy", "normalizer")
_OPTIONAL_RULES: Final = (
    "max_period",
    "same_error",
    "same_result",
    "revisit",
    "revisit_share",
    "failure_share",
)
"""Policy fields whose rule ``"off"`` (or ``false``) turns off."""
_POLICY_KEYS: Final = tuple(f.name for f in fields(LoopPolicy) if f.init)
_RETRY_KEYS: Final = tuple(f.name for f in fields(RetryPolicy) if f.init)
_POLL_KEYS: Final = tuple(f.name for f in fields(Poll) if f.init)
_NORMALIZER_KEYS: Final = ("volatile_keys_add", "volatile_keys_remove", "max_bytes")


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """What a policy file says: the policy and the normalizer to replay with."""

    policy: LoopPolicy
    normalizer: Normalizer
    source: str
    """Where it came from (a path, or ``<string>``)."""


def _unknown(where: str, data: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    for key in data:
        if key not in allowed:
            name = f"{where}.{key}" if where else key
            raise ConfigError(name, data[key], f"a known key (one of {', '.join(allowed)})",
                              message=f"unknown key {name!r} in the policy file; known keys here: {', '.join(allowed)}")


def _is_off(value: Any) -> bool:
    """``"off"`` or ``false``: TOML has no null, so these turn an optional rule off."""
    return value is False or value == "off"


def _table(where: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, value, "a table")
    return value


def _string_list(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(where, value, "a list of strings")
    return value


def _retry(where: str, data: Any) -> RetryPolicy:
    table = _table(where, data)
    _unknown(where, table, _RETRY_KEYS)
    kwargs = dict(table)
    if "errors" in kwargs:
        kwargs["errors"] = frozenset(_string_list(f"{where}.errors", kwargs["errors"]))
    try:
        return RetryPolicy(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field.removeprefix('RetryPolicy.')}", exc.value, exc.expected) from None
    except TypeError as exc:  # a wrongly typed value the dataclass could not take
        raise ConfigError(where, data, f"valid RetryPolicy settings ({exc})") from None


def _poll(where: str, data: Any) -> Poll:
    table = _table(where, data)
    _unknown(where, table, _POLL_KEYS)
    for key in _POLL_KEYS:
        if key not in table:
            raise ConfigError(f"{where}.{key}", None, "a number of seconds (interval_s and max_wait_s are both required)")
    try:
        return Poll(**table)
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc.field.removeprefix('Poll.')}", exc.value, exc.expected) from None


def parse_policy(data: Mapping[str, Any], source: str = "<string>") -> PolicyFile:
    """Build the policy and normalizer a parsed policy file describes.

    Raises:
        ConfigError: an unknown or missing version, an unknown key, or an invalid value; the
            error's ``field`` is the dotted key (``policy.window``).
    """
    _unknown("", data, _TOP_KEYS)
    version = data.get("version")
    if version is None:
        raise ConfigError("version", None, f"one of {list(SUPPORTED_VERSIONS)}",
                          message=f"{source}: the policy file needs a version key (version = 1)")
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        raise ConfigError("version", version, f"one of {list(SUPPORTED_VERSIONS)}",
                          message=f"{source}: policy file version {version!r} is not supported by this tripwire (supported: {list(SUPPORTED_VERSIONS)}); upgrade tripwire")
    preset = data.get("preset", "default")
    if not isinstance(preset, str):
        raise ConfigError("preset", preset, "a preset name")
    base = LoopPolicy.preset(preset)

    policy_table = _table("policy", data.get("policy", {}))
    _unknown("policy", policy_table, _POLICY_KEYS)
    changes: dict[str, Any] = {}
    for key, value in policy_table.items():
        where = f"policy.{key}"
        if key in _OPTIONAL_RULES and _is_off(value):
            changes[key] = None
        elif key == "polling_tools":
            changes[key] = frozenset(_string_list(where, value))
        elif key == "retry":
            changes[key] = None if _is_off(value) else _retry(where, value)
        elif key == "polls":
            table = _table(where, value)
            changes[key] = {tool: _poll(f"{where}.{tool}", poll) for tool, poll in table.items()}
        elif key == "retry_per_tool":
            table = _table(where, value)
            changes[key] = {tool: _retry(f"{where}.{tool}", rp) for tool, rp in table.items()}
        else:
            changes[key] = value
    try:
        policy = base.evolve(**changes)
    except ConfigError as exc:
        raise ConfigError(f"policy.{exc.field}", exc.value, exc.expected) from None

    norm_table = _table("normalizer", data.get("normalizer", {}))
    _unknown("normalizer", norm_table, _NORMALIZER_KEYS)
    add = _string_list("normalizer.volatile_keys_add", norm_table.get("volatile_keys_add", []))
    remove = _string_list("normalizer.volatile_keys_remove", norm_table.get("volatile_keys_remove", []))
    max_bytes = norm_table.get("max_bytes", DEFAULT_NORMALIZER.max_bytes)
    try:
        normalizer = Normalizer(
            volatile_keys=(DEFAULT_NORMALIZER.volatile_keys | frozenset(add)) - frozenset(remove),
            max_bytes=max_bytes,
        )
    except ConfigError as exc:
        raise ConfigError(f"normalizer.{exc.field}", exc.value, exc.expected) from None
    return PolicyFile(policy=policy, normalizer=normalizer, source=source)


def load_policy_file(path: str | os.PathLike[str]) -> PolicyFile:
    """Read and check a ``tripwire.toml`` policy file.

    Raises:
        ConfigError: the file cannot be read, is not TOML, or describes an invalid policy
            (the ``field`` names the key).
    """
    text_path = os.fspath(path)
    try:
        with open(text_path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError("--policy", text_path, "a readable TOML file",
                          message=f"cannot read the policy file {text_path} ({exc.strerror or exc}); check the path") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("--policy", text_path, "valid TOML",
                          message=f"{text_path} is not valid TOML: {exc}") from None
    return parse_policy(data, text_path)


def apply_overrides(
    policy: LoopPolicy,
    normalizer: Normalizer,
    *,
    policy_changes: Mapping[str, Any] | None = None,
    volatile_add: Iterable[str] = (),
    volatile_remove: Iterable[str] = (),
    polling_tools: Iterable[str] = (),
) -> tuple[LoopPolicy, Normalizer]:
    """Command-line overrides on top of a preset or policy file (``None`` values are skipped).

    ``polling_tools`` are added to the policy's polling tools; volatile keys are added to /
    removed from the normalizer's.

    Raises:
        ConfigError: an override gives an invalid policy.
    """
    changes = {k: v for k, v in (policy_changes or {}).items() if v is not None}
    polling = frozenset(polling_tools)
    if polling:
        changes["polling_tools"] = policy.polling_tools | polling
    if changes:
        policy = policy.evolve(**changes)
    add, remove = tuple(volatile_add), tuple(volatile_remove)
    if add or remove:
        normalizer = normalizer.with_volatile_keys(add=add, remove=remove)
    return policy, normalizer
