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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tripwire.config import FILE_VERSIONS, config_from_file, read_toml
from tripwire.core.policy import LoopPolicy
from tripwire.core.signature import Normalizer

__all__ = ["SUPPORTED_VERSIONS", "PolicyFile", "load_policy_file", "parse_policy"]

SUPPORTED_VERSIONS = FILE_VERSIONS
"""Policy file versions this tripwire reads."""


@dataclass(frozen=True, slots=True)
class PolicyFile:
    """What a policy file says: the policy and the normalizer to replay with."""

    policy: LoopPolicy
    """The loop policy (the preset with the file's fields applied)."""
    normalizer: Normalizer
    """The normalizer (the default one with the file's changes applied)."""
    source: str
    """Where it came from (a path, or ``<string>``)."""


def parse_policy(data: Mapping[str, Any], source: str = "<string>") -> PolicyFile:
    """Build the policy and normalizer a parsed policy file describes (no environment read).

    Raises:
        ConfigError: an unknown or missing version, an unknown key, or an invalid value; the
            error's ``field`` is the dotted key (``policy.window``), its message names the file.
    """
    config = config_from_file(data, source, policy_only=True)
    return PolicyFile(policy=config.policy, normalizer=config.normalizer, source=source)


def load_policy_file(path: str | os.PathLike[str]) -> PolicyFile:
    """Read and check a ``tripwire.toml`` policy file (the environment is not read).

    To combine it with the environment and options, use :func:`tripwire.config.load_config`
    with ``policy_file=path``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 or not TOML, or describes an invalid
            policy (the ``field`` names the key).
    """
    text_path = os.fspath(path)
    return parse_policy(read_toml(text_path, "--policy", "the policy file"), text_path)
