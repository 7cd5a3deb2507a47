"""The loop rules, each defined once: trip test, limit, sentence, hint, and whether results count.

Every consumer reads this table: the watcher (:mod:`tripwire.core.watch`) runs the trip tests in
table order and builds the verdict's reason from :meth:`LoopRule.sentence`; the
:class:`~tripwire.errors.LoopDetected` message is the same sentence with the signature prefix,
the call index and :attr:`LoopRule.hint`. A rule's limit is read from
:class:`~tripwire.core.policy.LoopPolicy` by the field's name (:attr:`LoopRule.limit`), and
worked out once per policy into :class:`TripLimits`.

Adding a rule is one entry in :data:`RULES` plus its tests (and, when it counts something the
watcher does not count yet, that counter in :func:`tripwire.core.watch.evaluate`). The entries
of one ``group`` are alternatives: the first of them that trips is the group's trip (a cycle
made of one repeated call is the repetition rule's, not the period rule's).

``retry_of_non_retryable`` is in the table for its sentence and hint; it has no limit and no
trip test here, because it is decided before any other rule and never waits for a count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from tripwire.core.reasons import Rule

if TYPE_CHECKING:
    from tripwire.core.policy import LoopPolicy
    from tripwire.core.watch import RunState

__all__ = [
    "MUTE_SPAN",
    "NEVER",
    "RULES",
    "LoopRule",
    "TripLimits",
    "loop_message",
    "rule_entry",
    "trip_limits",
]

NEVER: Final = 1 << 62
"""The count of a rule that is off: never reached."""

MUTE_SPAN: Final = 2
"""The mute-failures rule counts within the last ``MUTE_SPAN × window`` calls."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TripLimits:
    """The counts at which each rule trips under one policy, by :attr:`LoopRule.limit` name.

    A rule that is off has :data:`NEVER`. Built once per policy (:func:`trip_limits`), so the
    watcher's per-call check that no rule can trip is a few named integer comparisons.
    """

    threshold: int
    """Identical calls within the window (repetition)."""
    min_repeats: int
    """Back-to-back repetitions of a cycle (period); :data:`NEVER` when ``max_period`` is off."""
    same_error: int
    """Consecutive failures with the same error class."""
    same_result: int
    """Consecutive calls of one tool that found nothing (an empty result)."""
    revisit: int
    """Consecutive calls that revisit an earlier (call, result) pair."""
    revisit_share: int
    """Revisits among the last ``window`` calls, as a count."""
    failure_share: int
    """Failed calls among the last ``window`` calls, as a count."""
    mute_failures: int
    """Calls that failed with nothing to say within the last ``2 × window`` calls."""


Trip = tuple[int, int]
"""What a trip test returns when its rule trips: ``(period, hits)``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopRule:
    """One loop rule: when it trips, what it reads from the policy, and how it is explained."""

    rule: Rule
    """The :class:`~tripwire.core.reasons.Rule` recorded in verdicts and exceptions."""
    limit: str
    """The :class:`~tripwire.core.policy.LoopPolicy` field (and :class:`TripLimits` field) that
    sets the count at which it trips; empty for a rule decided without a count."""
    count: Callable[[LoopPolicy], int | None]
    """The trip count under a policy (``None`` = the rule is off), read from :attr:`limit`."""
    test: Callable[[RunState, int, TripLimits], Trip | None]
    """``test(state, hits, limits)`` after a call is recorded (``hits``: occurrences of that
    call's key in the window): ``(period, hits)`` when the rule trips, else ``None``."""
    group: str
    """Entries of one group are alternatives: only the first that trips counts."""
    windowed: bool = False
    """True when the rule counts a share of the whole window (every call in it is evidence)."""
    results_are_evidence: bool = True
    """Whether a changed result explains the repetition away. Not for rules whose calls get the
    same result by definition, or where a changing error message is not progress."""
    sentence: str
    """What happened, as a format string over ``tool``, ``hits``, ``window``, ``period``,
    ``calls`` (hits × period), ``sig`` (a signature prefix or empty) and ``error`` (an error
    class in parentheses, or empty). The verdict's reason starts with it; so does the exception
    message."""
    hint: str
    """What to do, appended to the exception message; ``{declare_poll}`` stands for
    :func:`declare_poll`'s advice for the tool (see :meth:`advice`)."""

    def describe(
        self, *, tool: str, hits: int, window: int, period: int = 1, sig: str = "", error: str = ""
    ) -> str:
        """The sentence, filled in (``span`` is ``MUTE_SPAN × window``)."""
        return self.sentence.format(
            tool=tool,
            hits=hits,
            window=window,
            span=MUTE_SPAN * window,
            period=period,
            calls=hits * period,
            sig=sig,
            error=error,
        )

    def advice(self, tool: str) -> str:
        """The hint, filled in for ``tool``."""
        if "{declare_poll}" in self.hint:
            return self.hint.replace("{declare_poll}", declare_poll(tool))
        return self.hint


def _limit(name: str) -> Callable[[LoopPolicy], int | None]:
    def count(policy: LoopPolicy) -> int | None:
        value: int | None = getattr(policy, name)
        return value

    return count


def _share(name: str) -> Callable[[LoopPolicy], int | None]:
    def count(policy: LoopPolicy) -> int | None:
        share: float | None = getattr(policy, name)
        return None if share is None else policy.share_count(share)

    return count


def _period_count(policy: LoopPolicy) -> int | None:
    return None if policy.max_period is None else policy.min_repeats


def _no_test(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return None


def _repetition(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, hits) if hits >= limits.threshold else None


def _period(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    runs = state.runs
    if not runs or limits.min_repeats >= NEVER:
        return None
    # runs[p] is where period p's run began: its length is calls - runs[p].
    calls = state.calls
    # A cycle whose unit is one call repeated (all of its last p - 1 steps equal to their
    # predecessor) is period 1: the repetition rule's job.
    same = calls - runs[1] if 1 in runs else 0
    need = limits.min_repeats - 1
    for p in sorted(runs):
        run = calls - runs[p]
        if p >= 2 and run >= need * p and same < p - 1:
            return (p, run // p + 1)
    return None


def _same_error(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, state.error_run) if state.error_run >= limits.same_error else None


def _same_result(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, state.outcome_run) if state.outcome_run >= limits.same_result else None


def _revisit(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, state.revisit_run) if state.revisit_run >= limits.revisit else None


def _revisit_share(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, state.revisits_recent) if state.revisits_recent >= limits.revisit_share else None


def _failures(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    return (1, state.failed_recent) if state.failed_recent >= limits.failure_share else None


def _mute(state: RunState, hits: int, limits: TripLimits) -> Trip | None:
    at = state.mute_at  # call indices of the latest failures with nothing to say, in the span
    if at is None or at[-1] != state.calls or len(at) < limits.mute_failures:
        return None  # trips only at such a failure: the count does not decay between them
    return (1, len(at))


RETRY_OF_NON_RETRYABLE: Final = LoopRule(
    rule=Rule.RETRY_OF_NON_RETRYABLE,
    limit="",
    count=lambda policy: None,
    test=_no_test,
    group="retry",
    sentence=(
        "{tool} was called again with identical arguments{sig} after it failed with an "
        "error{error} marked non-retryable"
    ),
    hint="change the arguments or report the failure instead of retrying",
)

RULES: Final[tuple[LoopRule, ...]] = (
    LoopRule(
        rule=Rule.REPETITION,
        limit="threshold",
        count=_limit("threshold"),
        test=_repetition,
        group="repeat",
        sentence="{tool} repeated {hits}× with identical arguments{sig} in the last {window} calls",
        hint="tell the model to change approach, or {declare_poll}",
    ),
    LoopRule(
        rule=Rule.PERIOD,
        limit="min_repeats",
        count=_period_count,
        test=_period,
        group="repeat",
        sentence="the last {calls} calls, ending with {tool}{sig}, repeat a cycle of {period} calls {hits}×",
        hint=(
            "tell the model to change approach, or raise LoopPolicy(min_repeats=...) if this "
            "cycle is expected"
        ),
    ),
    LoopRule(
        rule=Rule.SAME_ERROR,
        limit="same_error",
        count=_limit("same_error"),
        test=_same_error,
        group="same_error",
        results_are_evidence=False,
        sentence="the last {hits} calls, ending with {tool}, all failed with the same error",
        hint=(
            "fix the cause or report it instead of trying variations, or raise "
            "LoopPolicy(same_error=...)"
        ),
    ),
    LoopRule(
        rule=Rule.SAME_RESULT,
        limit="same_result",
        count=_limit("same_result"),
        test=_same_result,
        group="same_result",
        results_are_evidence=False,
        sentence="the last {hits} {tool} calls all found nothing (an empty result), whatever their arguments",
        hint="tell the model this search is exhausted, or raise LoopPolicy(same_result=...)",
    ),
    LoopRule(
        rule=Rule.REVISIT,
        limit="revisit",
        count=_limit("revisit"),
        test=_revisit,
        group="revisit",
        results_are_evidence=False,
        sentence=(
            "{hits} consecutive calls, ending with {tool}, each repeated an earlier call and got "
            "the same result"
        ),
        hint="tell the model it is going in circles, or raise LoopPolicy(revisit=...)",
    ),
    LoopRule(
        rule=Rule.REVISIT,
        limit="revisit_share",
        count=_share("revisit_share"),
        test=_revisit_share,
        group="revisit",
        windowed=True,
        results_are_evidence=False,
        sentence=(
            "{hits} of the last {window} calls, ending with {tool}, each repeated an earlier call "
            "and got the same result"
        ),
        hint="tell the model it is going in circles, or raise LoopPolicy(revisit_share=...)",
    ),
    LoopRule(
        rule=Rule.FAILURES,
        limit="failure_share",
        count=_share("failure_share"),
        test=_failures,
        group="failures",
        windowed=True,
        results_are_evidence=False,
        sentence="{hits} of the last {window} calls, up to {tool}, failed",
        hint=(
            "fix the environment or report it instead of trying variations, or raise "
            "LoopPolicy(failure_share=...)"
        ),
    ),
    LoopRule(
        rule=Rule.FAILURES,
        limit="mute_failures",
        count=_limit("mute_failures"),
        test=_mute,
        group="failures",
        results_are_evidence=False,
        sentence=(
            "{hits} calls within the last {span}, up to {tool}, failed with nothing to say "
            "(command not found, no such file), whatever the tools"
        ),
        hint=(
            "tell the model what exists (the commands installed, the paths) or fix the "
            "environment, or raise LoopPolicy(mute_failures=...)"
        ),
    ),
)
"""Every loop rule with a trip test, in the order the watcher tries them."""

_BY_LIMIT: Final[Mapping[str, LoopRule]] = MappingProxyType(
    {entry.limit: entry for entry in (*RULES, RETRY_OF_NON_RETRYABLE)}
)
_BY_RULE: Final[Mapping[Rule, LoopRule]] = MappingProxyType(
    {entry.rule: entry for entry in reversed((RETRY_OF_NON_RETRYABLE, *RULES))}
)
"""The first entry of each rule (what a :class:`LoopDetected` built by hand is described by)."""

_LIMIT_FIELDS: Final = frozenset(f.name for f in fields(TripLimits))
if {entry.limit for entry in RULES} != _LIMIT_FIELDS:  # pragma: no cover - a table edit
    raise AssertionError("every rule's limit needs a TripLimits field, and no other field")


def rule_entry(rule: Rule, limit: str = "") -> LoopRule:
    """The table entry of ``rule``; ``limit`` picks among a rule's entries (revisit in a row or
    as a share of the window), else the rule's first entry."""
    entry = _BY_LIMIT.get(limit) if limit else None
    if entry is None or entry.rule is not rule:
        entry = _BY_RULE[rule]
    return entry


def trip_limits(policy: LoopPolicy) -> TripLimits:
    """Every rule's trip count under ``policy`` (:data:`NEVER` for a rule that is off)."""
    counts: dict[str, int] = {}
    for entry in RULES:
        count = entry.count(policy)
        counts[entry.limit] = NEVER if count is None else count
    return TripLimits(**counts)


def loop_message(
    rule: Rule,
    *,
    tool: str,
    hits: int,
    window: int,
    period: int,
    call_index: int,
    digest: str,
    limit: str = "",
) -> str:
    """The :class:`~tripwire.errors.LoopDetected` message: the rule's sentence with the
    signature prefix, where it tripped, and the hint."""
    entry = rule_entry(rule, limit)
    sig = f" (sig {digest[:8]}…)" if digest else ""
    what = entry.describe(tool=tool, hits=hits, window=window, period=period, sig=sig)
    return f"{what} (tripped at call {call_index}); {entry.advice(tool)}"


def _toml_key(name: str) -> str:
    """``name`` as one TOML key: bare when TOML allows it, else a quoted basic string."""
    if name and all(c.isascii() and (c.isalnum() or c in "_-") for c in name):
        return name
    escaped = "".join(
        f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\' else c for c in name
    )
    return f'"{escaped}"'


def declare_poll(tool: str) -> str:
    """The one advice for a repeated call that may be a poll: declare it, in Python or in the
    policy file. Its TOML (the message's last lines) is valid as written: a tool name with a
    dot, a slash or a space is quoted (``[policy.polls."./mvnw"]``). The numbers are an
    example; the reader puts in the poll's own interval and longest wait."""
    return (
        f"if {tool} polls something that takes time, declare it with its interval and longest "
        f"wait in seconds: LoopPolicy(polls={{{tool!r}: Poll(interval_s=10, max_wait_s=600)}}), "
        f"or in tripwire.toml:\n[policy.polls.{_toml_key(tool)}]\ninterval_s = 10\nmax_wait_s = 600"
    )
