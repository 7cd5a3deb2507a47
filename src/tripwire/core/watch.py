"""The loop watcher's core: per-run state, the repetition and period rules, and the verdict.

One :class:`RunState` per run holds the last ``window`` call keys in a ring with a count per
key (the repetition rule is O(1) per call), and for each period p in 1..max_period the length
of the current run of positions where ``call[i] == call[i - p]`` (the period rule is
O(max_period) per call, independent of the window). Evidence (results, progress
fingerprints) sits in parallel rings allocated only once a run supplies some.

When a rule trips, the verdict is decided in this order (DESIGN.md, job 2):

1. a valid dependency lease → ``waiting``;
2. a retry policy covering the repeat → ``retrying``;
3. progress evidence: an explicit progress fingerprint changed across the repeated calls, or a
   result digest changed where results count as evidence → ``working``; no evidence at all
   under ``require_evidence`` → ``uncertain``; name-only signatures → ``uncertain`` (default);
4. otherwise → ``stuck``.

A call repeated with the same arguments after an error explicitly marked non-retryable is
``stuck`` at once (rule ``retry_of_non_retryable``), whatever the threshold or ``confirm``.

Further rules, calibrated on real agent runs (see the README, "How well it works"):
``same_error`` (consecutive calls failing with the same error class, whatever the arguments:
fighting a broken toolchain), ``failures`` (most of the last ``window`` calls failed, whatever
the error; or ``mute_failures`` calls within the last ``2 × window`` failed with nothing to say,
"command not found" or "No such file", whatever the tools: a run calling things that are not
there), ``same_result`` (consecutive calls of one tool that all found nothing, whatever
their arguments) and ``revisit`` (consecutive calls, or most of the last ``window``, that each
repeat an earlier call of the run and get the same result: a cycle too long for the window; a
stretch replayed in order counts from its third time through, see :data:`REPLAY_GRACE`).
Results are not evidence for these: they are about failures and results that do not change.
For the repetition and period rules a changed result is evidence even when the calls failed
(decided on recorded runs: see ``docs/policy.md``).

A call repeated with the same result as a check between changes (each repeat after a call made
once in the window that did not fail: edit, rerun, another edit, rerun) is ``working`` under the
repetition rule, also when the check prints nothing, unless it failed with nothing to say
("command not found"; see :func:`_checks_between_changes`).

A declared poll (:attr:`LoopPolicy.polls`) repeating with the same result is ``waiting``
until its maximum wait, then ``stuck``; checked right after the lease.

A ``stuck``/``uncertain`` verdict stays in force until a whole window of calls passes without
any rule tripping: a single different call inside a loop is not a recovery.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, Final, NamedTuple

import msgspec

from tripwire.core._compiled import compiled, speedups
from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import KeyMode, LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.rules import (
    MUTE_SPAN,
    NEVER,
    RETRY_OF_NON_RETRYABLE,
    RULES,
    LoopRule,
    declare_poll,
    loop_message,
)
from tripwire.core.signature import EMPTY_RESULT, Normalizer, Signature
from tripwire.errors import LoopDetected

__all__ = ["COMPILED", "Assessment", "Failure", "RunState", "evaluate", "evaluate_hashed", "preview"]

_MASK64: Final = (1 << 64) - 1

_EMPTY: Final = hash(EMPTY_RESULT) or 1
"""The ring's hash of a result that found nothing (what the same-result rule counts)."""

_FAILURE_RULES: Final = frozenset((Rule.SAME_ERROR, Rule.FAILURES))
"""Rules a declared poll never explains: failing is not waiting."""

REPLAY_GRACE: Final = 3
"""How many revisits in a row an in-order replay of an earlier stretch may count (revisit rule).

A revisit whose earlier occurrence comes right after the previous revisit's is part of an
in-order replay: the same stretch of calls done again, in the same order, with the same
results. The first few such calls count (re-reading a file from the top, a search run again);
past this many, a replay counts only where its pair has come back at least twice before (the
third time through). A batch done twice (15 writes, then the same 15 again, each answered
"done") is not a loop; the same batch a third time is. On the recorded runs this removes a
false alarm and loses one runaway of 65 (see the README, "How well it works")."""


class Failure(NamedTuple):
    """The last failure of one signature still in the window."""

    error_type: str | None
    """The error class (``None`` for a call declared non-retryable without one)."""
    retryable: bool | None
    """The retryable flag the call declared."""
    end_s: float | None
    """When the failed call ended."""
    attempts: int
    """Consecutive failed attempts of this signature."""
    call_index: int
    """1-based index of the call that failed."""


_TOOL_ARGS: Final = KeyMode.TOOL_ARGS
_WORKING: Final = Verdict.WORKING
_STUCK: Final = Verdict.STUCK
_UNCERTAIN: Final = Verdict.UNCERTAIN

_NO_RUNS: Final[dict[int, int]] = {}
"""The shared empty period-run table (never mutated: a non-empty table is always a new dict)."""

_ARGS_SWITCH: Final = (
    "arguments were not recorded, so these calls may differ; switch argument capture on "
    "(e.g. OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY, TRACELOOP_TRACE_CONTENT=true, "
    "pydantic-ai include_content=True) or use LoopPolicy(key='tool')"
)


class Assessment(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict on a run after one call, with what decided it.

    Values are recorded at the call where the verdict began; they never hold raw arguments.
    """

    verdict: Verdict
    """working / retrying / waiting / stuck / uncertain."""
    rule: Rule | None = None
    """The loop rule that tripped (``None`` when none did)."""
    tool: str | None = None
    """The tool of the call at which the rule tripped."""
    digest: str | None = None
    """Signature digest of that call (use a prefix in messages)."""
    hits: int = 0
    """How many times the repeated unit occurred (calls for repetition, cycles for period)."""
    period: int | None = None
    """Cycle length for the period rule, 1 for repetition, ``None`` when nothing tripped."""
    window: int = 0
    """The policy's window."""
    call_index: int = 0
    """1-based index, among the run's tool calls, of the call this assessment is about."""
    reason: str = ""
    """One sentence on why, naming the evidence (or its absence)."""
    arguments_seen: bool = True
    """False when the deciding signature had no arguments (name-only)."""
    policy_version: str = ""
    normalizer_version: str = ""
    limit: str = ""
    """The :class:`~tripwire.core.policy.LoopPolicy` field whose count tripped (``threshold``,
    ``revisit_share``…; empty when no rule tripped, or for ``retry_of_non_retryable``)."""

    def exception(self, **fields: Any) -> LoopDetected:
        """The :class:`~tripwire.errors.LoopDetected` that stops a run on this assessment.

        ``fields`` are passed on (e.g. ``counters=``, ``partial=``, ``receipt=``).
        """
        rule = self.rule if self.rule is not None else Rule.REPETITION
        tool = self.tool or ""
        period = self.period or 1
        digest = self.digest or ""
        message = loop_message(
            rule,
            tool=tool,
            hits=self.hits,
            window=self.window,
            period=period,
            call_index=self.call_index,
            digest=digest,
            limit=self.limit,
        )
        return LoopDetected(
            message,
            rule=rule,
            tool=tool,
            hits=self.hits,
            window=self.window,
            period=period,
            call_index=self.call_index,
            digest=digest,
            **fields,
        )


class RunState:
    """All mutable per-run state of the loop watcher (``__slots__``; a few hundred bytes).

    Build one per run with :meth:`new`; feed it with :func:`evaluate`.
    """

    __slots__ = (
        "calls",
        "confirm_streak",
        "counts",
        "current",
        "error_run",
        "failed_recent",
        "failures",
        "keys",
        "last_error",
        "last_result",
        "last_tool",
        "last_trip",
        "lease",
        "marks",
        "mute_at",
        "outcome_run",
        "polls",
        "progress",
        "recent",
        "replay_at",
        "replay_run",
        "results",
        "revisit_run",
        "revisits_recent",
        "runs",
        "seen",
        "seen_at",
        "seen_meta",
    )

    def __init__(self, window: int, max_period: int) -> None:
        self.calls = 0
        """Calls observed so far."""
        self.keys: list[int | None] = [None] * window
        """Ring of the last ``window`` keys; slot ``(calls - 1) % window`` is the newest."""
        self.counts: dict[int, int] = {}
        """Occurrences of each key in the ring."""
        self.recent: list[int | None] = [None] * max_period
        """The keys of the last ``max_period`` calls, newest first (``recent[p - 1]`` is p back)."""
        self.runs: dict[int, int] = _NO_RUNS
        """For each period p with a run: the call count at which the run began, so that
        ``calls - runs[p]`` is the number of trailing positions i with key[i] == key[i - p].
        Only periods with a run are present: a call unlike its last
        ``max_period`` predecessors, the common case, leaves it empty. Held as a start, a run
        that goes on costs nothing: a call that repeats the one before it in a run of
        ``max_period`` repeats changes neither this nor ``recent``."""
        self.results: array[int] | None = None
        """Ring of result hashes, 0 for "no result" (allocated on the first result)."""
        self.progress: list[str | None] | None = None
        """Ring of progress fingerprints (allocated on the first fingerprint)."""
        self.failures: dict[int, Failure] | None = None
        """Last failure of each signature still in the window, oldest first."""
        self.seen: bytearray | None = None
        """The last ``revisit_memory`` (signature, result) pairs, 8 bytes each, as a ring: one
        C-level ``find`` answers "seen before?" in a few hundred bytes (revisit rule)."""
        self.seen_at = 0
        """Next slot of the ``seen`` ring."""
        self.seen_meta: list[int] | None = None
        """Per ``seen`` slot: the 1-based call index of the pair's first occurrence times 256,
        plus how many times it has occurred (capped at 255)."""
        self.replay_at = -2
        """The first-occurrence index of the pair the previous call revisited (-2: none)."""
        self.replay_run = 0
        """Consecutive revisits that follow an earlier stretch in order (an in-order replay)."""
        self.polls: dict[str, tuple[int, float | None, int]] | None = None
        """Per declared poll tool: the result hash of its last call, when that result first
        came back (call time), and how many polls in a row got it."""
        self.last_tool: str | None = None
        """The previous call's tool (same-result rule)."""
        self.last_result = 0
        """The previous call's result hash, 0 when it had none (same-result rule)."""
        self.outcome_run = 0
        """Consecutive calls of the same tool that got the same result (same-result rule)."""
        self.revisit_run = 0
        """Consecutive calls that repeated an earlier call and got the same result."""
        self.marks: bytearray | None = None
        """Ring of per-call marks, parallel to ``keys`` (bit 0: failed; bit 1: a revisit),
        allocated on the first failure or revisit."""
        self.failed_recent = 0
        """Failed calls among the last ``window`` (bit 0 of ``marks``)."""
        self.mute_at: list[int] | None = None
        """The call indices of the latest calls that failed with nothing to say (an empty
        result), within the last ``MUTE_SPAN × window`` calls, at most ``mute_failures`` of them
        (mute-failures rule; allocated on the first such failure)."""
        self.revisits_recent = 0
        """Revisits among the last ``window`` (bit 1 of ``marks``)."""
        self.error_run = 0
        """Consecutive failed calls with the same error class."""
        self.last_error: str | None = None
        self.lease: Lease | None = None
        """A run-level dependency lease (a call's own lease takes precedence)."""
        self.last_trip = -(10**9)
        """Index of the last call at which a rule tripped."""
        self.confirm_streak = 0
        self.current: Assessment | None = None
        """The verdict in force (``None`` until the first call)."""

    @classmethod
    def new(cls, policy: LoopPolicy) -> RunState:
        """Empty state sized for ``policy``."""
        return cls(policy.window, policy.max_period or 1)

    def copy(self) -> RunState:
        """An independent copy (what :func:`preview` runs a call on)."""
        twin = RunState.__new__(RunState)
        for name in RunState.__slots__:
            value = getattr(self, name)
            if type(value) in _MUTABLE:
                value = value[:] if type(value) is not dict else value.copy()
            setattr(twin, name, value)
        return twin


_MUTABLE: Final = frozenset((list, dict, bytearray, array))


def evaluate(
    state: RunState,
    call: ToolCall,
    policy: LoopPolicy,
    normalizer: Normalizer,
    *,
    signature: Signature | None = None,
    now_s: float | None = None,
) -> Assessment | None:
    """Record ``call`` in ``state`` and return the new assessment if the verdict changed.

    Args:
        state: the run's state (mutated).
        call: the finished tool call.
        policy: the loop policy (unchanged for the life of ``state``).
        normalizer: the signature normalizer.
        signature: the call's signature if the caller already computed it.
        now_s: the time to judge leases at; defaults to the call's end (or start) time.

    Returns:
        The assessment when the verdict changed at this call, else ``None``; the verdict in
        force is always ``state.current``.
    """
    sig = normalizer.signature(call.tool, call.arguments) if signature is None else signature
    digest = call.result_digest
    # 0 marks "no result"; a digest hashing to 0 is stored as 1 (a harmless collision).
    return evaluate_hashed(
        state, call, sig, (hash(digest) or 1) if digest is not None else 0, policy, normalizer, now_s
    )


def preview(
    state: RunState,
    tool: str,
    signature: Signature,
    policy: LoopPolicy,
    normalizer: Normalizer,
    *,
    now_s: float | None = None,
) -> Assessment | None:
    """The ``stuck`` assessment the run would get if ``tool`` were called now, else ``None``.

    The call is assumed to succeed and to return the result that the last call with the same key
    among the ``window - 1`` calls that stay in the window with it got, or no result if there is
    none: what an agent repeating itself gets.
    The guard calls this before a tool body runs, to refuse the call that would trip a rule.
    ``state`` is never changed. When no rule could trip at the next call (the common case) this
    is a few count checks; otherwise the call is tried on a copy of the state.

    Returns:
        The assessment :func:`evaluate` would put in force at that call, when it is ``stuck``
        (``retry_of_non_retryable`` included); ``None`` otherwise.
    """
    args_key = signature.key
    key = args_key if policy.key is _TOOL_ARGS else normalizer.tool_signature(tool).key
    limits = policy.trip_limits
    window = policy.window
    index = state.calls + 1
    slot = (index - 1) % window
    keys = state.keys
    hits = state.counts.get(key, 0) + 1 - (keys[slot] == key)
    results = state.results
    if (
        hits < limits.threshold
        and key not in state.recent
        and not (state.failures and args_key in state.failures)
        and state.failed_recent < limits.failure_share
        and (
            results is None
            or (
                state.outcome_run + 1 < limits.same_result
                and state.revisit_run + 1 < limits.revisit
                and state.revisits_recent + 1 < limits.revisit_share
            )
        )
    ):
        return None
    result = 0
    if results is not None:
        # The calls that stay in the window with this one, newest first.
        for back in range(min(state.calls, window - 1)):
            s = (index - 2 - back) % window
            if keys[s] == key:
                result = results[s]
                break
    twin = state.copy()
    evaluate_hashed(twin, ToolCall(tool=tool), signature, result, policy, normalizer, now_s)
    current = twin.current
    if current is not None and current.verdict is _STUCK and current.call_index == index:
        return current
    return None


def evaluate_hashed(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    result: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
    now_s: float | None,
) -> Assessment | None:
    """:func:`evaluate` for a signed call whose result hash is ``result``, all positional.

    ``result`` is ``hash(call.result_digest) or 1``, or 0 when the call has no result (what
    :func:`evaluate` passes). For callers on the hot path that already hold the signature and
    know the call has no result (:class:`~tripwire.LoopDetector`): one call less per tool call.

    When ``tripwire.core._watchstep`` is built, its ``step`` does the bookkeeping below (ring,
    counts, period runs, results and revisit rings, streaks, marks, the "can any rule trip"
    test) for the calls it handles and says what comes next; this Python path is its reference,
    and runs for every other call (see ``_watchstep.c``).
    """
    args_key = sig.key
    if _step is not None:
        # The compiled bookkeeping (_watchstep.c) of the calls it handles: no error, no
        # progress, no retry of a failure in the window, keyed on tool and arguments, no polls.
        hits = _step(state, call, args_key, result, policy)
        if hits is None:
            return None
        if hits > 0:
            return _judge(state, call, sig, args_key, hits, state.calls, policy, normalizer, now_s, None)
        if hits == 0:
            return _quiet(state, call, state.calls, policy, normalizer)
        # -1: not a call it handles; nothing was touched
    key = args_key if policy.key is _TOOL_ARGS else normalizer.tool_signature(call.tool).key
    window = policy.window
    state.calls = index = state.calls + 1
    slot = (index - 1) % window

    # --- the call goes into the ring: counts, period runs, evidence (inlined: the hot path) --
    keys = state.keys
    counts = state.counts
    old = keys[slot]
    if old == key:
        hits = counts[key]  # the key that leaves the window comes back in: no count changes
    else:
        if old is not None:
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        keys[slot] = key
        hits = counts[key] = counts.get(key, 0) + 1

    # Period runs: only the periods p at which this key equals the key p calls back can
    # continue a run; every other run breaks. ``key in recent`` is one C-level scan.
    recent = state.recent
    if key in recent:
        runs = state.runs
        if len(runs) != len(recent) or key != recent[0]:
            begin = index - 1  # a run that starts here is 1 long
            fresh: dict[int, int] = {}
            for p, k in enumerate(recent, start=1):
                if k == key:
                    fresh[p] = runs.get(p, begin)
            state.runs = fresh
            recent.insert(0, key)
            recent.pop()
        # else every period had a run at the previous call, so its last ``max_period`` keys
        # were one key, and this call repeats it: every run goes on, ``recent`` is unchanged.
    else:
        if state.runs:
            state.runs = _NO_RUNS
        recent.insert(0, key)
        recent.pop()

    results = state.results
    error = call.error_type
    if (
        not result
        and results is None
        and error is None
        and call.progress is None
        and state.progress is None
        and state.marks is None
        and not state.failures
        and call.retryable is not False
        and not policy.polls
    ):
        # A call with no evidence, in a run that never had any (the LoopDetector's calls):
        # nothing to record. No result yet means no streak of results and no revisit; no marks
        # means no failure, so no run of errors.
        if hits < policy.trip_limits.threshold and not state.runs:
            current = state.current
            if current is not None and current.verdict is _WORKING:
                state.confirm_streak = 0
                return None
            return _quiet(state, call, index, policy, normalizer)
        return _judge(state, call, sig, key, hits, index, policy, normalizer, now_s, None)

    if result or results is not None:
        if results is None:
            results = state.results = array("q", bytes(8 * window))
        results[slot] = result
    if call.progress is not None or state.progress is not None:
        progress = state.progress
        if progress is None:
            progress = state.progress = [None] * window
        progress[slot] = call.progress

    if error is not None:
        state.error_run = state.error_run + 1 if error == state.last_error else 1
        state.last_error = error
        if result == _EMPTY:
            _track_mute(state, index, policy)
    elif state.error_run:
        state.error_run = 0
        state.last_error = None

    # Same-result streak: consecutive calls of one tool that found nothing.
    if result == _EMPTY:
        tool = call.tool
        if state.last_result == _EMPTY and tool == state.last_tool:
            state.outcome_run += 1
        else:
            state.outcome_run = 1
        state.last_tool = tool
        state.last_result = result
    elif state.last_result or state.outcome_run:
        state.outcome_run = 0
        state.last_result = 0
    if policy.polls and call.tool in policy.polls:
        _track_poll(state, call, result, now_s)

    # --- retry of a non-retryable failure: decided before anything else, never delayed ----
    prior: Failure | None = None
    if state.failures or error is not None or call.retryable is False:
        prior, decided, outcome = _failure_step(state, call, sig, index, policy, normalizer)
        if decided:
            if error is not None or state.marks is not None:
                _mark(state, slot, 0 if error is None else 1, window)
            return outcome
    # This call's mark (bit 0: failed, bit 1: a revisit), written once.
    mark = 0 if error is None else 1
    if not result:
        state.revisit_run = 0
    elif (policy.revisit is not None or policy.revisit_share is not None) and _track_revisit(
        state, policy, args_key, result
    ):
        mark += 2
    marks = state.marks
    if marks is not None:
        old_mark = marks[slot]
        if old_mark != mark:
            marks[slot] = mark
            state.failed_recent += (mark & 1) - (old_mark & 1)
            state.revisits_recent += (mark >> 1) - (old_mark >> 1)
    elif mark:
        marks = _mark(state, slot, mark, window)

    # --- the rules: can any trip at this call? (a few named comparisons; RULES holds each
    # rule's own test, run below only when one might). Without marks no call has failed or
    # been a revisit; without results no streak of results has begun. -------------------
    limits = policy.trip_limits
    if (
        hits < limits.threshold
        and not state.runs
        and (
            marks is None
            or (
                state.error_run < limits.same_error
                and state.failed_recent < limits.failure_share
                and state.revisits_recent < limits.revisit_share
                and (
                    state.mute_at is None
                    or state.mute_at[-1] != index
                    or len(state.mute_at) < limits.mute_failures
                )
            )
        )
        and (
            results is None
            or (state.outcome_run < limits.same_result and state.revisit_run < limits.revisit)
        )
    ):
        current = state.current
        if current is not None and current.verdict is _WORKING:  # the common case, inlined
            state.confirm_streak = 0
            return None
        return _quiet(state, call, index, policy, normalizer)

    return _judge(state, call, sig, key, hits, index, policy, normalizer, now_s, prior)


def _mark(state: RunState, slot: int, mark: int, window: int) -> bytearray:
    """Write ``mark`` into the marks ring (allocated here on first use) and its counts."""
    marks = state.marks
    if marks is None:
        marks = state.marks = bytearray(window)
    old_mark = marks[slot]
    marks[slot] = mark
    state.failed_recent += (mark & 1) - (old_mark & 1)
    state.revisits_recent += (mark >> 1) - (old_mark >> 1)
    return marks


def _failure_step(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    index: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
) -> tuple[Failure | None, bool, Assessment | None]:
    """Failure bookkeeping for a call that failed, was declared non-retryable, or may repeat a
    failure still in the window; decides ``retry_of_non_retryable``.

    Returns the signature's previous failure (if still in the window), whether the verdict is
    decided here, and if so what :func:`evaluate` returns.
    """
    args_key = sig.key
    window = policy.window
    failures = state.failures
    prior: Failure | None = None
    if failures:
        prior = failures.get(args_key)
        if prior is not None and index - prior.call_index >= window:
            # The failure is no longer among the last ``window`` calls (this call included).
            del failures[args_key]
            prior = None
    if prior is None and call.error_type is None and call.retryable is not False:
        return None, False, None
    if prior is not None and prior.retryable is False and not sig.name_only:
        _remember_failure(state, args_key, call, prior, window)
        state.last_trip = index
        return prior, True, _set(
            state,
            Assessment(
                verdict=Verdict.STUCK,
                rule=Rule.RETRY_OF_NON_RETRYABLE,
                tool=call.tool,
                digest=sig.digest,
                hits=prior.attempts + 1,
                period=1,
                window=window,
                call_index=index,
                reason=RETRY_OF_NON_RETRYABLE.describe(
                    tool=call.tool,
                    hits=prior.attempts + 1,
                    window=window,
                    error=f" ({prior.error_type or 'unknown'})",
                ),
                policy_version=policy.version,
                normalizer_version=normalizer.version,
            ),
        )
    _remember_failure(state, args_key, call, prior, window)
    return prior, False, None


def _judge(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    key: int,
    hits: int,
    index: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
    now_s: float | None,
    prior: Failure | None,
) -> Assessment | None:
    """The verdict after a call at which some rule may have tripped: every rule that trips, in
    table order (one per group); evidence that explains one rule away does not explain away
    another (a repeated edit whose results changed once may still be part of a run that keeps
    revisiting the same results)."""
    limits = policy.trip_limits
    if hits >= limits.threshold and prior is None:
        held = _still_stuck(state, call, sig, hits, index, policy, normalizer)
        if held is not None:
            state.last_trip = index
            state.current = held
            return None  # stuck before, stuck now: the verdict did not change
    trips: list[tuple[LoopRule, int, int]] = []
    tripped_groups: set[str] = set()
    for entry in RULES:
        if entry.group in tripped_groups:
            continue
        trip = entry.test(state, hits, limits)
        if trip is not None:
            tripped_groups.add(entry.group)
            trips.append((entry, trip[0], trip[1]))

    if not trips:  # only a period run that is not yet a cycle
        return _quiet(state, call, index, policy, normalizer)

    state.last_trip = index
    # The first rule not explained away decides; if every one is, the first one's "working" does.
    decisions = (
        _decide(state, call, sig, key, policy, normalizer, entry, period, rule_hits, index, now_s, prior)
        for entry, period, rule_hits in trips
    )
    assessment = next(decisions)
    if assessment.verdict is _WORKING:
        assessment = next((d for d in decisions if d.verdict is not _WORKING), assessment)
    if assessment.verdict is Verdict.STUCK and policy.confirm > 1:
        state.confirm_streak += 1
        if state.confirm_streak < policy.confirm:
            return None
    return _set(state, assessment)


def _still_stuck(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    hits: int,
    index: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
) -> Assessment | None:
    """The repetition verdict of a run that repeats the call that made it stuck, without the
    evidence checks, when they cannot answer differently; else ``None`` (decide in full).

    The previous call tripped the repetition rule with the same key and was ``stuck``: no lease,
    no retry, no progress fingerprint, results unchanged. If this call has the same key and the
    same result, no lease and no fingerprint in the run, the repeated calls' results can only
    lose a value as the window slides, never gain a new one, so the verdict is ``stuck`` again.
    This keeps a run that stays stuck O(1) per call instead of O(window).
    """
    current = state.current
    if (
        current is None
        or current.verdict is not _STUCK
        or current.call_index != index - 1
        or current.limit != "threshold"
        or current.tool != call.tool
        or state.progress is not None
        or call.lease is not None
        or state.lease is not None
        or policy.confirm > 1
        or call.tool in policy.polls  # a declared poll waits until its maximum wait: decide in full
    ):
        return None
    window = policy.window
    previous = (index - 2) % window
    if state.keys[previous] != state.keys[(index - 1) % window]:
        return None
    results = state.results
    if results is not None:
        result = results[(index - 1) % window]
        if result != results[previous] or (policy.require_evidence and not result):
            return None
    elif policy.require_evidence:
        return None
    if (
        current.hits == hits
        and current.normalizer_version == normalizer.version
        and (policy.key is _TOOL_ARGS or current.digest == sig.digest)
    ):
        # The same call, the same count, the same policy: the verdict in force, moved on to this
        # call (every other field, the reason included, would be written the same).
        return _replace(current, call_index=index)
    entry = _REPETITION
    return Assessment(
        verdict=Verdict.STUCK,
        rule=entry.rule,
        tool=call.tool,
        digest=sig.digest,
        hits=hits,
        period=1,
        window=window,
        call_index=index,
        reason=(
            f"{entry.describe(tool=call.tool, hits=hits, window=window)} with no new evidence"
            + (f"; {declare_poll(call.tool)}" if results is not None else "")
        ),
        arguments_seen=not sig.name_only,
        policy_version=policy.version,
        normalizer_version=normalizer.version,
        limit=entry.limit,
    )


_replace: Final = msgspec.structs.replace

_REPETITION: Final = RULES[0]
if _REPETITION.limit != "threshold":  # pragma: no cover - a table edit
    raise AssertionError("the repetition rule must stay first in RULES")


def _quiet(
    state: RunState, call: ToolCall, index: int, policy: LoopPolicy, normalizer: Normalizer
) -> Assessment | None:
    """The verdict after a call at which no rule tripped."""
    state.confirm_streak = 0
    current = state.current
    if current is not None:
        verdict = current.verdict
        if verdict is _WORKING:
            return None
        if index - state.last_trip < policy.window and (verdict is _STUCK or verdict is _UNCERTAIN):
            return None  # a loop verdict holds until a whole window passes without a trip
    return _set(state, _working(call, index, policy, normalizer))


def _set(state: RunState, assessment: Assessment) -> Assessment | None:
    previous = state.current
    state.current = assessment
    if previous is not None and previous.verdict is assessment.verdict:
        return None
    return assessment


_FIRST_WORKING: Final[dict[tuple[str, str, int], Assessment]] = {}
"""Every run's first verdict, ``working`` at call 1, by policy, normalizer and window: one
frozen value shared by the runs it describes (held by every active run, it would otherwise cost
each one its own copy)."""


def _working(call: ToolCall, index: int, policy: LoopPolicy, normalizer: Normalizer) -> Assessment:
    if index == 1:
        key = (policy.version, normalizer.version, policy.window)
        shared = _FIRST_WORKING.get(key)
        if shared is None:
            if len(_FIRST_WORKING) >= 64:
                _FIRST_WORKING.clear()  # a pure cache: bounded, and correct when emptied
            shared = _FIRST_WORKING[key] = _new_working(index, policy, normalizer)
        return shared
    return _new_working(index, policy, normalizer)


def _new_working(index: int, policy: LoopPolicy, normalizer: Normalizer) -> Assessment:
    return Assessment(
        verdict=Verdict.WORKING,
        call_index=index,
        window=policy.window,
        reason="no loop rule tripped",
        policy_version=policy.version,
        normalizer_version=normalizer.version,
    )


def _track_revisit(state: RunState, policy: LoopPolicy, args_key: int, result: int) -> bool:
    """Count consecutive calls whose (signature, result) pair was seen before in the run;
    True when this call is such a revisit."""
    seen = state.seen
    if seen is None:
        seen = state.seen = bytearray(8 * policy.revisit_memory)
    packed = ((args_key ^ result) & _MASK64 or 1).to_bytes(8, "little")
    meta = state.seen_meta
    if meta is None:
        meta = state.seen_meta = [0] * policy.revisit_memory
    at = seen.find(packed)
    while at > 0 and at & 7:  # a match straddling two entries is no match
        at = seen.find(packed, at + 1)
    if at >= 0:
        slot = at >> 3
        entry = meta[slot]
        first = entry >> 8
        times = entry & 255
        if times < 255:
            times += 1
            meta[slot] = entry + 1
        if first == state.replay_at + 1:
            state.replay_at = first
            state.replay_run = replay_run = state.replay_run + 1
            if replay_run >= REPLAY_GRACE and times < 3:
                return False  # a stretch done again in order: counts from the third time through
        else:
            state.replay_at = first
            if state.replay_run:
                state.replay_run = 0
        state.revisit_run += 1
        return True
    state.revisit_run = 0
    state.replay_run = 0
    state.replay_at = -2
    slot = state.seen_at
    seen[slot * 8 : slot * 8 + 8] = packed
    meta[slot] = state.calls * 256 + 1
    state.seen_at = (slot + 1) % policy.revisit_memory
    return False


def _track_mute(state: RunState, index: int, policy: LoopPolicy) -> None:
    """Remember that call ``index`` failed with nothing to say (mute-failures rule): keep the
    indices of such calls within the last ``MUTE_SPAN × window`` calls, at most as many as the
    rule's count (bounded, O(count) per such call)."""
    limit = policy.trip_limits.mute_failures
    if limit >= NEVER:
        return
    at = state.mute_at
    if at is None:
        at = state.mute_at = []
    at.append(index)
    span = MUTE_SPAN * policy.window
    while index - at[0] >= span or len(at) > limit:
        del at[0]


def _track_poll(state: RunState, call: ToolCall, result: int, now_s: float | None) -> None:
    """Remember since when a declared poll has been getting the result it got now."""
    polls = state.polls
    if polls is None:
        polls = state.polls = {}
    at = call.start_s if call.start_s is not None else (call.end_s if call.end_s is not None else now_s)
    last = polls.get(call.tool)
    if last is not None and last[0] == result:
        polls[call.tool] = (result, last[1], last[2] + 1)
    else:
        polls[call.tool] = (result, at, 1)


def _remember_failure(
    state: RunState,
    args_key: int,
    call: ToolCall,
    prior: Failure | None,
    window: int,
) -> None:
    failures = state.failures
    if call.failed or call.retryable is False:
        if failures is None:
            failures = state.failures = {}
        attempts = prior.attempts + 1 if prior is not None else 1
        failures.pop(args_key, None)  # re-insert: the dict's order is the failures' recency
        failures[args_key] = Failure(call.error_type, call.retryable, call.end_s, attempts, state.calls)
        if len(failures) > window:
            # Bounded like the window: forget the oldest failure first.
            del failures[next(iter(failures))]
    elif prior is not None and failures is not None:
        failures.pop(args_key, None)


def _repeated_slots(
    state: RunState, key: int, entry: LoopRule, period: int, hits: int, window: int
) -> list[int]:
    """Ring slots of the calls that form the repetition, oldest first."""
    index = state.calls
    if entry.windowed:  # a share of the window: the whole window is the repetition
        return [(index - 1 - back) % window for back in range(min(index, window) - 1, -1, -1)]
    if entry.rule is Rule.REPETITION:
        span = min(index, window)
        slots = [(index - 1 - back) % window for back in range(span - 1, -1, -1)]
        return [s for s in slots if state.keys[s] == key]
    span = min(index, window, period * hits if entry.rule is Rule.PERIOD else hits)
    return [(index - 1 - back) % window for back in range(span - 1, -1, -1)]


def _decide(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    key: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
    entry: LoopRule,
    period: int,
    hits: int,
    index: int,
    now_s: float | None,
    prior: Failure | None,
) -> Assessment:
    window = policy.window

    def verdict(v: Verdict, reason: str) -> Assessment:
        return Assessment(
            verdict=v,
            rule=entry.rule,
            tool=call.tool,
            digest=sig.digest,
            hits=hits,
            period=period,
            window=window,
            call_index=index,
            reason=reason,
            arguments_seen=not sig.name_only,
            policy_version=policy.version,
            normalizer_version=normalizer.version,
            limit=entry.limit,
        )

    what = entry.describe(tool=call.tool, hits=hits, window=window, period=period)

    # 1. a valid dependency lease
    lease = call.lease or state.lease
    if lease is not None:
        at = now_s if now_s is not None else (call.end_s if call.end_s is not None else call.start_s)
        if at is not None and lease.valid_at(at, policy.max_lease_renewals):
            return verdict(
                Verdict.WAITING,
                f"{what}, while {lease.owner} holds a lease until t={lease.deadline_s:g}",
            )

    # 1b. a declared poll getting the same answer, inside its maximum wait
    poll = policy.polls.get(call.tool) if policy.polls else None
    tracked = state.polls.get(call.tool) if poll is not None and state.polls else None
    if poll is not None and tracked is not None and tracked[2] >= 2 and entry.rule not in _FAILURE_RULES:
        at = call.start_s if call.start_s is not None else (call.end_s if call.end_s is not None else now_s)
        waited = at - tracked[1] if at is not None and tracked[1] is not None else None
        same = f"the same result for {waited:g} s" if waited is not None else f"the same result {tracked[2]}×"
        if not poll.waited_too_long(waited, tracked[2]):
            return verdict(
                Verdict.WAITING,
                f"{what}; {call.tool} is a declared poll with {same}, inside its maximum wait of "
                f"{poll.max_wait_s:g} s",
            )
        if tracked[0]:
            return verdict(
                Verdict.STUCK,
                f"{what}; {call.tool} is a declared poll, but it has returned {same}, past its "
                f"maximum wait of {poll.max_wait_s:g} s",
            )

    # 2. a retry policy: the previous identical call failed with an error it covers, this is
    # attempt <= max_attempts, and the gap since that failure follows the schedule.
    retry = policy.retry_for(call.tool)
    if retry is not None and prior is not None and retry.covers(prior.error_type, prior.retryable):
        attempt = call.attempt or prior.attempts + 1
        if attempt <= retry.max_attempts:
            gap_ok = True
            if call.start_s is not None and prior.end_s is not None:
                gap_ok = call.start_s - prior.end_s >= retry.min_gap_s(attempt)
            if gap_ok:
                return verdict(
                    Verdict.RETRYING,
                    f"{what}; attempt {attempt} of {retry.max_attempts} after "
                    f"{prior.error_type or 'a retryable error'}, inside the retry policy",
                )

    # 3. evidence
    slots = _repeated_slots(state, key, entry, period, hits, window)
    progress = state.progress
    if progress is not None:
        fingerprints = [progress[s] for s in slots if progress[s] is not None]
        if len(fingerprints) >= 2 and fingerprints[0] != fingerprints[-1]:
            return verdict(Verdict.WORKING, f"{what}, but the progress fingerprint changed")
    results = state.results
    result_evidence = policy.result_is_evidence(call.tool)
    # An error message that changes is not progress; a revisit or a same-result streak means the
    # results repeat by definition.
    if (
        results is not None
        and result_evidence
        and entry.results_are_evidence
        and _results_changed(results, slots, entry.rule, period)
    ):
        return verdict(Verdict.WORKING, f"{what}, but the results differ (new evidence)")
    if (
        entry.rule is Rule.REPETITION
        and results is not None
        and result_evidence
        and _checks_between_changes(state, slots, window)
    ):
        return verdict(
            Verdict.WORKING,
            f"{what}, but each repeat came after a call made once in the window "
            "(a check between changes)",
        )
    if policy.require_evidence:
        has_evidence = (progress is not None and any(progress[s] is not None for s in slots)) or (
            results is not None and result_evidence and any(results[s] for s in slots)
        )
        if not has_evidence:
            return verdict(
                Verdict.UNCERTAIN,
                f"{what}, and the policy requires evidence but none was supplied "
                "(pass a progress fingerprint or record results)",
            )
    if sig.name_only and policy.key is KeyMode.TOOL_ARGS and policy.name_only == "uncertain":
        return verdict(Verdict.UNCERTAIN, f"{what}; {_ARGS_SWITCH}")

    # 4. nothing explains it
    if poll is None and entry.rule in (Rule.REPETITION, Rule.PERIOD) and results is not None:
        # The calls got the same results: it may be a poll nobody declared.
        return verdict(Verdict.STUCK, f"{what} with no new evidence; {declare_poll(call.tool)}")
    return verdict(Verdict.STUCK, f"{what} with no new evidence")


def _checks_between_changes(state: RunState, slots: list[int], window: int) -> bool:
    """True when a repeated call is a check run between changes, not a loop: every repeat got a
    result, and between each two repeats came a call that succeeded and occurs only once in the
    window (edit, rerun the same test, another edit, rerun). The action sequence does not
    repeat, only the check does.

    A check is a check even when it prints nothing: a script or test that succeeds silently is
    still checked after each change. A check that *failed* with nothing to say ("command not
    found", recorded as a failure with an empty result) is not one: editing around a missing
    compiler is fighting the environment. Otherwise whether the check failed does not matter (a
    test that still fails after a new edit is the agent working on it); failing streaks are the
    ``same_error`` and ``failures`` rules' job. Decided on the recorded runs (docs/policy.md).
    """
    results = state.results
    if results is None:
        return False
    marks = state.marks
    for s in slots:
        r = results[s]
        if r == 0 or (r == _EMPTY and marks is not None and marks[s] & 1):
            return False
    keys = state.keys
    counts = state.counts
    for a, b in pairwise(slots):
        s = (a + 1) % window
        while s != b:
            k = keys[s]
            if k is not None and counts.get(k) == 1 and not (marks is not None and marks[s] & 1):
                break
            s = (s + 1) % window
        else:
            return False
    return True


def _results_changed(results: Sequence[int], slots: list[int], rule: Rule, period: int) -> bool:
    """True when the repeated calls' results differ: new evidence.

    For a cycle, each call is compared with the call one period earlier (the same step of the
    previous round); comparing a ``search`` result with a ``read`` result would always differ.
    """
    if rule is Rule.PERIOD:
        for j in range(period, len(slots)):
            a, b = results[slots[j]], results[slots[j - period]]
            if a and b and a != b:
                return True
        return False
    distinct = {r for r in (results[s] for s in slots) if r}
    return len(distinct) > 1


COMPILED: Final = speedups() is not None
"""True when the compiled leaf helpers of :mod:`tripwire.core.signature` are in use."""


def _compiled_step() -> Callable[[RunState, ToolCall, int, int, LoopPolicy], int | None] | None:
    """``_watchstep.step`` set up for this module's classes, or ``None`` (not built, disabled
    by ``TRIPWIRE_NO_EXTENSIONS``, or a layout it cannot read): then :func:`evaluate_hashed`
    does all of its bookkeeping in Python."""
    module = compiled("core._watchstep")
    if module is None:
        return None
    try:
        module.configure(RunState, ToolCall, _NO_RUNS, _WORKING, array, _TOOL_ARGS, _EMPTY, REPLAY_GRACE)
    except TypeError:
        return None
    step: Callable[[RunState, ToolCall, int, int, LoopPolicy], int | None] = module.step
    return step


_step: Final = _compiled_step()
"""The compiled per-call bookkeeping of :func:`evaluate_hashed`, or ``None``."""
