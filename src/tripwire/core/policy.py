"""Loop policies: what counts as a loop, and what explains a repetition away.

A policy is an immutable value; all per-run state lives in :class:`~tripwire.core.watch.RunState`.
Everything that can be worked out once (the per-tool retry table, the version string) is
worked out at construction.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from tripwire.core.rules import TripLimits, trip_limits
from tripwire.errors import ConfigError

__all__ = [
    "DEFAULT_POLICY",
    "SEED_POLICY",
    "KeyMode",
    "LoopPolicy",
    "Poll",
    "ResultEvidence",
    "RetryPolicy",
]

POLICY_SCHEME: Final = "p4"
"""Bump when what a rule computes changes in a way the fields do not show (p2: same_result counts
only results that found nothing; in-order replays of a stretch count as revisits late; declared
polls. p3: a call repeated as a check between changes, each time after a call made once in the
window, is working under the repetition rule. p4: such a check is one also when it prints
nothing, unless it failed)."""


class KeyMode(str, Enum):
    """What makes two calls "the same action"."""

    TOOL_ARGS = "tool+args"
    """Tool name and canonical arguments (default)."""
    TOOL = "tool"
    """Tool name only: for small tool catalogs, or when arguments are never recorded."""


class ResultEvidence(str, Enum):
    """Which tools' results count as progress evidence when they change."""

    OFF = "off"
    """Results are never evidence."""
    POLLING = "polling"
    """Only the results of tools listed in ``polling_tools``."""
    ALL = "all"
    """Any tool's result: the same call giving a new result is new evidence."""


MAX_WINDOW: Final = 10_000
"""The largest ``window`` (the per-run rings hold this many entries)."""
MAX_COUNT: Final = 1_000_000
"""The largest count any other limit accepts: beyond it a rule could never trip in a real run."""
MAX_SECONDS: Final = 1e9
"""The longest interval or tolerance a retry policy accepts (about 31 years)."""


def _positive_int(name: str, value: Any, minimum: int = 1, maximum: int = MAX_COUNT) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= maximum:
        raise ConfigError(name, value, f"an integer from {minimum} to {maximum:,}")


def _non_negative(name: str, value: Any, maximum: float = MAX_SECONDS) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= maximum:
        raise ConfigError(name, value, f"a number from 0 to {maximum:g}")


def _names(name: str, value: Any) -> frozenset[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError(name, value, "a set of tool or error names (strings)")
    names = frozenset(value)
    if not all(isinstance(n, str) for n in names):
        raise ConfigError(name, sorted(map(repr, names)), "a set of tool or error names (strings)")
    return names


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """A declared retry policy: repeats inside it are ``retrying``, not ``stuck``.

    A repeat is covered when the previous identical call failed with a covered error, the
    attempt number is at most ``max_attempts``, and the observed gap since that failure is at
    least ``interval_s * backoff_rate ** (attempt - 2) - tolerance_s``.
    """

    errors: frozenset[str] = frozenset()
    """Error classes (``error.type`` values) this policy retries."""
    retryable_flag: bool = True
    """Also cover any error the tool explicitly marked ``retryable=True``."""
    max_attempts: int = 3
    """Attempts in all, the first included: attempt ``max_attempts + 1`` is no longer covered."""
    interval_s: float = 0.0
    """The delay before the second attempt."""
    backoff_rate: float = 1.0
    """Each further delay is the previous one times this."""
    tolerance_s: float = 0.0
    """How much shorter than the schedule an observed gap may be (clock jitter)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "errors", _names("RetryPolicy.errors", self.errors))
        _positive_int("RetryPolicy.max_attempts", self.max_attempts)
        _non_negative("RetryPolicy.interval_s", self.interval_s)
        _non_negative("RetryPolicy.tolerance_s", self.tolerance_s)
        if isinstance(self.backoff_rate, bool) or not isinstance(self.backoff_rate, (int, float)) or not 1 <= self.backoff_rate <= 1000:
            raise ConfigError("RetryPolicy.backoff_rate", self.backoff_rate, "a number from 1 to 1000")

    def covers(self, error_type: str | None, retryable: bool | None) -> bool:
        """True when a failure with this error class / retryable flag is one this policy retries."""
        if error_type is None and retryable is None:
            return False
        if retryable is False:
            return False
        if error_type is not None and error_type in self.errors:
            return True
        return bool(self.retryable_flag and retryable)

    def min_gap_s(self, attempt: int) -> float:
        """The shortest gap before ``attempt`` (2 = first retry) that the schedule allows."""
        if attempt < 2:
            return 0.0
        return self.interval_s * self.backoff_rate ** (attempt - 2) - self.tolerance_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Poll:
    """A declared polling tool: asking again and getting the same answer is ``waiting``.

    Repeating a declared poll with the same result is ``waiting`` while the same result has come
    back for at most ``max_wait_s`` (measured from the first call that got it, on the calls'
    own clock); after that it is ``stuck``. Without call times, the wait is counted in polls:
    at most ``max_wait_s / interval_s`` polls after the first. A result that changes is
    progress, as for any tool.
    """

    interval_s: float
    """The expected time between two polls (also what turns the wait into a count of polls when
    the calls carry no times)."""
    max_wait_s: float
    """How long the same result may keep coming back before the poll is stuck."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "max_wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
                raise ConfigError(f"Poll.{name}", value, "a number of seconds above 0 and below 1e9")

    def waited_too_long(self, waited_s: float | None, polls: int) -> bool:
        """True when the same result has come back for longer than :attr:`max_wait_s` (or, with
        no clock, for more polls than ``max_wait_s / interval_s`` after the first)."""
        if waited_s is not None:
            return waited_s > self.max_wait_s
        return polls - 1 > self.max_wait_s / self.interval_s


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopPolicy:
    """When a run counts as looping, and what explains a repetition (leases, retries, evidence).

    ``None`` turns an optional rule off. Make variants with :meth:`evolve`.

    The defaults are calibrated on 768 real recorded agent runs (issue 7; README, "How well it
    works"): results count as evidence for every tool (``result_evidence="all"``), cycles up to
    8 calls (``max_period=8``), ``same_error=5``, ``same_result=6``, ``revisit=6``, ``revisit_share=0.8``,
    ``failure_share=0.8`` and ``mute_failures=4`` are on. They deliberately
    differ from the first design's ``max_period=3`` with polling-only result evidence; the plain
    repetition rule is the ``seed`` preset (:data:`SEED_POLICY`), and :class:`LoopDetector`
    keeps ``max_period=3`` with no evidence.
    """

    name: str = "default"
    """A label recorded in the version string (``default``, ``seed``, or your own)."""
    window: int = 10
    """How many of the most recent calls the repetition rule looks at."""
    threshold: int = 4
    """How many identical calls within ``window`` trip the repetition rule."""
    key: KeyMode = KeyMode.TOOL_ARGS
    """What makes two calls the same: tool + arguments, or the tool name only."""
    max_period: int | None = 8
    """Longest cycle the period rule looks for (2..max_period); ``None`` turns the rule off."""
    min_repeats: int = 3
    """How many times a cycle must repeat back to back to trip the period rule."""
    same_error: int | None = 5
    """Trip after this many consecutive failed calls with the same error class, whatever the
    arguments (``None`` = off)."""
    same_result: int | None = 6
    """Trip after this many consecutive calls of one tool that all found nothing (an empty
    result: no output, ``[]``, "No matches found"), whatever their arguments (``None`` = off;
    needs recorded results). Results that say something (a confirmation, a status) never count:
    30 lookups that all answer "shipped" are a batch, not a loop."""
    revisit: int | None = 6
    """Trip after this many consecutive calls that each repeat an earlier call (same signature)
    *and* get the same result it got (``None`` = off; needs recorded results)."""
    revisit_memory: int = 32
    """How many distinct (call, result) pairs the revisit rule remembers per run."""
    revisit_share: float | None = 0.8
    """Also trip the revisit rule when at least this share of the last ``window`` calls (8 of
    10 by default) each repeated an earlier call and got the same result, consecutive or not
    (``None`` = off; needs recorded results)."""
    failure_share: float | None = 0.8
    """Trip when at least this share of the last ``window`` calls (8 of 10 by default) failed,
    whatever the tools, arguments and error classes: a run fighting a broken environment
    (``None`` = off)."""
    mute_failures: int | None = 4
    """Trip when this many calls within the last ``2 × window`` calls (20 by default) failed
    with nothing to say (a failure whose result is empty: "command not found", "No such file"),
    whatever the tools and arguments: a run calling things that are not there (``None`` = off;
    needs recorded errors and results)."""
    result_evidence: ResultEvidence = ResultEvidence.ALL
    """Whose changed results count as progress: none, polling tools only, or every tool."""
    polls: Mapping[str, Poll] = field(default_factory=dict)
    """Declared polling tools by name: repeating one with the same result is ``waiting`` until
    its :attr:`Poll.max_wait_s`, then ``stuck`` (see :class:`Poll`)."""
    polling_tools: frozenset[str] = frozenset()
    """Tools that legitimately repeat while waiting for something: a changed result is progress."""
    require_evidence: bool = False
    """When a rule trips and no evidence at all was supplied, say ``uncertain`` instead of
    ``stuck``."""
    name_only: str = "uncertain"
    """Verdict for a tripped rule whose signatures carry no arguments (capture switched off),
    under the ``tool+args`` key: ``"uncertain"`` (default) or ``"stuck"``."""
    retry: RetryPolicy | None = None
    """A retry policy for every tool without one in ``retry_per_tool``."""
    retry_per_tool: Mapping[str, RetryPolicy] = field(default_factory=dict)
    """Retry policies by tool name."""
    max_lease_renewals: int = 3
    """A lease renewed more often than this is ignored."""
    confirm: int = 1
    """Consecutive tripped evaluations needed before ``stuck`` (2 = hysteresis for noisy
    collectors). Never delays ``retry_of_non_retryable``."""
    version: str = field(init=False, compare=False)
    """A stable digest of every field above: record it with every verdict."""
    trip_limits: TripLimits = field(init=False, compare=False, repr=False)
    """Each rule's trip count under this policy, by field name (a rule that is off has a count
    never reached): the watcher's per-call check that no rule can trip is a few integer
    comparisons (:func:`tripwire.core.rules.trip_limits`)."""

    def __post_init__(self) -> None:
        _positive_int("window", self.window, 1, MAX_WINDOW)
        _positive_int("threshold", self.threshold, 2)
        if self.threshold > self.window:
            raise ConfigError(
                "threshold", self.threshold, f"at most window ({self.window}) or the rule never trips"
            )
        try:
            object.__setattr__(self, "key", KeyMode(self.key))
        except ValueError:
            raise ConfigError("key", self.key, "'tool+args' or 'tool'") from None
        try:
            object.__setattr__(self, "result_evidence", ResultEvidence(self.result_evidence))
        except ValueError:
            raise ConfigError("result_evidence", self.result_evidence, "'off', 'polling' or 'all'") from None
        if self.max_period is not None:
            _positive_int("max_period", self.max_period, 2, 1000)
        _positive_int("min_repeats", self.min_repeats, 2)
        if self.same_error is not None:
            _positive_int("same_error", self.same_error, 2)
        if self.same_result is not None:
            _positive_int("same_result", self.same_result, 2)
        if self.revisit is not None:
            _positive_int("revisit", self.revisit, 2)
        if self.mute_failures is not None:
            _positive_int("mute_failures", self.mute_failures, 2)
        _positive_int("revisit_memory", self.revisit_memory, 1, MAX_WINDOW)
        for name in ("revisit_share", "failure_share"):
            share = getattr(self, name)
            if share is not None and (
                isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1
            ):
                raise ConfigError(name, share, "a share of the window, above 0 and at most 1, or None")
        if self.name_only not in ("uncertain", "stuck"):
            raise ConfigError("name_only", self.name_only, "'uncertain' or 'stuck'")
        _positive_int("max_lease_renewals", self.max_lease_renewals, 0)
        _positive_int("confirm", self.confirm)
        object.__setattr__(self, "polling_tools", _names("polling_tools", self.polling_tools))
        if not isinstance(self.polls, Mapping):
            raise ConfigError("polls", self.polls, "a mapping of tool names to Poll values")
        for tool, poll in self.polls.items():
            if not isinstance(poll, Poll):
                raise ConfigError(f"polls[{tool!r}]", poll, "a Poll(interval_s=..., max_wait_s=...)")
        object.__setattr__(self, "polls", MappingProxyType(dict(self.polls)))
        if not isinstance(self.retry_per_tool, Mapping):
            raise ConfigError("retry_per_tool", self.retry_per_tool, "a mapping of tool name to RetryPolicy")
        for tool, rp in self.retry_per_tool.items():
            if not isinstance(rp, RetryPolicy):
                raise ConfigError(f"retry_per_tool[{tool!r}]", rp, "a RetryPolicy")
        if self.retry is not None and not isinstance(self.retry, RetryPolicy):
            raise ConfigError("retry", self.retry, "a RetryPolicy or None")
        object.__setattr__(self, "retry_per_tool", MappingProxyType(dict(self.retry_per_tool)))
        object.__setattr__(self, "version", f"{POLICY_SCHEME}:{self.name}:{self._digest()}")
        object.__setattr__(self, "trip_limits", trip_limits(self))

    def _digest(self) -> str:
        parts: list[str] = []
        for f in fields(self):
            if f.name in ("version", "name", "trip_limits"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, (frozenset, set)):
                value = sorted(value)
            elif isinstance(value, Mapping):
                value = sorted((k, repr(v)) for k, v in value.items())
            elif isinstance(value, Enum):
                value = value.value
            parts.append(f"{f.name}={value!r}")
        return hashlib.sha256(";".join(parts).encode()).hexdigest()[:10]

    def evolve(self, **changes: Any) -> LoopPolicy:
        """A copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)

    def share_count(self, share: float) -> int:
        """How many of the last ``window`` calls a share of the window is (at least 2)."""
        return max(2, math.ceil(share * self.window - 1e-9))

    def retry_for(self, tool: str) -> RetryPolicy | None:
        """The retry policy that applies to ``tool``, if any."""
        return self.retry_per_tool.get(tool, self.retry)

    def result_is_evidence(self, tool: str) -> bool:
        """True when a changed result of ``tool`` counts as progress."""
        mode = self.result_evidence
        if mode is ResultEvidence.ALL:
            return True
        return mode is ResultEvidence.POLLING and tool in self.polling_tools

    @classmethod
    def preset(cls, name: str) -> LoopPolicy:
        """A named preset: ``default`` or ``seed`` (see :data:`PRESETS`)."""
        try:
            return PRESETS[name]
        except (KeyError, TypeError):
            raise ConfigError("preset", name, f"one of {sorted(PRESETS)}") from None

    @classmethod
    def with_polling(cls, tools: Iterable[str], **kwargs: Any) -> LoopPolicy:
        """A policy where changed results of ``tools`` count as progress."""
        return cls(polling_tools=frozenset(tools), **kwargs)


DEFAULT_POLICY: Final = LoopPolicy()
"""The default policy."""

SEED_POLICY: Final = LoopPolicy(
    name="seed",
    window=10,
    threshold=4,
    max_period=None,
    same_error=None,
    same_result=None,
    revisit=None,
    revisit_share=None,
    failure_share=None,
    mute_failures=None,
    result_evidence=ResultEvidence.OFF,
    name_only="stuck",
)
"""The plain repetition rule (same tool + arguments 4 times in 10 calls), nothing else."""

PRESETS: Final[Mapping[str, LoopPolicy]] = MappingProxyType(
    {"default": DEFAULT_POLICY, "seed": SEED_POLICY}
)
