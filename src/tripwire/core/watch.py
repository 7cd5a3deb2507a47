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
the error), ``same_result`` (consecutive calls of one tool getting the same result) and
``revisit`` (consecutive calls, or most of the last ``window``, that each repeat an earlier call
of the run and get the same result: a cycle too long for the window). Results are not evidence
for these: a changing error message is not progress, and a revisit is by definition the same
result again.

A ``stuck``/``uncertain`` verdict stays in force until a whole window of calls passes without
any rule tripping: a single different call inside a loop is not a recovery.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from tripwire.core._compiled import speedups
from tripwire.core.events import Lease, ToolCall
from tripwire.core.policy import KeyMode, LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.signature import Normalizer, Signature
from tripwire.errors import LoopDetected

__all__ = ["COMPILED", "Assessment", "RunState", "evaluate"]

_MASK64: Final = (1 << 64) - 1

_RESULTS_ARE_NOT_EVIDENCE: Final = frozenset(
    {Rule.SAME_ERROR, Rule.SAME_RESULT, Rule.REVISIT, Rule.FAILURES}
)

_Failure = tuple[str | None, bool | None, float | None, int, int]
"""The last failure of one signature: error class, retryable flag, end time, consecutive failed
attempts, and the 1-based index of the call that failed."""

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

    def exception(self, **fields: Any) -> LoopDetected:
        """The :class:`~tripwire.errors.LoopDetected` that stops a run on this assessment.

        ``fields`` are passed on (e.g. ``counters=``, ``partial=``, ``receipt=``).
        """
        return LoopDetected(
            rule=self.rule if self.rule is not None else Rule.REPETITION,
            tool=self.tool or "",
            hits=self.hits,
            window=self.window,
            period=self.period or 1,
            call_index=self.call_index,
            digest=self.digest or "",
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
        "outcome_run",
        "progress",
        "recent",
        "results",
        "revisit_run",
        "revisits_recent",
        "runs",
        "seen",
        "seen_at",
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
        """runs[p]: trailing positions i with key[i] == key[i - p]; only non-zero entries (a call
        unlike its last ``max_period`` predecessors, the common case, leaves it empty)."""
        self.results: array[int] | None = None
        """Ring of result digests (allocated on the first result)."""
        self.progress: list[str | None] | None = None
        """Ring of progress fingerprints (allocated on the first fingerprint)."""
        self.failures: dict[int, _Failure] | None = None
        """Last failure of each signature still in the window: error, retryable, end, attempts."""
        self.seen: bytearray | None = None
        """The last ``revisit_memory`` (signature, result) pairs, 8 bytes each, as a ring: one
        C-level ``find`` answers "seen before?" in a few hundred bytes (revisit rule)."""
        self.seen_at = 0
        """Next slot of the ``seen`` ring."""
        self.last_tool: str | None = None
        """The previous call's tool (same-result rule)."""
        self.last_result: str | None = None
        """The previous call's result digest (same-result rule)."""
        self.outcome_run = 0
        """Consecutive calls of the same tool that got the same result (same-result rule)."""
        self.revisit_run = 0
        """Consecutive calls that repeated an earlier call and got the same result."""
        self.marks: bytearray | None = None
        """Ring of per-call marks, parallel to ``keys`` (bit 0: failed; bit 1: a revisit),
        allocated on the first failure or revisit."""
        self.failed_recent = 0
        """Failed calls among the last ``window`` (bit 0 of ``marks``)."""
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
    args_key = sig.key
    key = args_key if policy.key is _TOOL_ARGS else normalizer.tool_signature(call.tool).key
    window = policy.window
    state.calls = index = state.calls + 1
    slot = (index - 1) % window

    # --- the call goes into the ring: counts, period runs, evidence (inlined: the hot path) --
    keys = state.keys
    counts = state.counts
    old = keys[slot]
    if old is not None:
        left = counts[old] - 1
        if left:
            counts[old] = left
        else:
            del counts[old]
    keys[slot] = key
    hits = counts.get(key, 0) + 1
    counts[key] = hits

    # Period runs: only the periods p at which this key equals the key p calls back can
    # continue a run; every other run breaks. ``key in recent`` is one C-level scan.
    recent = state.recent
    if key in recent:
        previous_runs = state.runs
        fresh: dict[int, int] = {}
        for p, k in enumerate(recent, start=1):
            if k == key:
                fresh[p] = previous_runs.get(p, 0) + 1
        state.runs = fresh
    elif state.runs:
        state.runs = _NO_RUNS
    recent.insert(0, key)
    recent.pop()

    digest = call.result_digest
    if digest is not None or state.results is not None:
        results = state.results
        if results is None:
            results = state.results = array("q", bytes(8 * window))
        # 0 marks "no result"; a digest hashing to 0 is stored as 1 (a harmless collision).
        results[slot] = (hash(digest) or 1) if digest is not None else 0
    if call.progress is not None or state.progress is not None:
        progress = state.progress
        if progress is None:
            progress = state.progress = [None] * window
        progress[slot] = call.progress

    error = call.error_type
    if error is not None:
        state.error_run = state.error_run + 1 if error == state.last_error else 1
        state.last_error = error
    elif state.error_run:
        state.error_run = 0
        state.last_error = None
    marks = state.marks
    if marks is not None or error is not None:
        failed = error is not None
        if marks is None:
            marks = state.marks = bytearray(window)
        old_mark = marks[slot]
        if old_mark:
            state.failed_recent -= old_mark & 1
            state.revisits_recent -= old_mark >> 1
        marks[slot] = failed
        state.failed_recent += failed

    # Same-result streak: only a recorded result can continue or start one.
    if digest is not None:
        tool = call.tool
        if digest == state.last_result and tool == state.last_tool:
            state.outcome_run += 1
        else:
            state.outcome_run = 1
        state.last_tool = tool
        state.last_result = digest
    elif state.last_result is not None or state.outcome_run:
        state.outcome_run = 0
        state.last_result = None

    # --- retry of a non-retryable failure: decided before anything else, never delayed ----
    prior: _Failure | None = None
    if state.failures or error is not None or call.retryable is False:
        prior, decided, outcome = _failure_step(state, call, sig, args_key, index, policy, normalizer)
        if decided:
            return outcome
    if digest is None:
        state.revisit_run = 0
    elif (policy.revisit is not None or policy.revisit_share is not None) and _track_revisit(
        state, policy, args_key, digest
    ):
        marks = state.marks
        if marks is None:
            marks = state.marks = bytearray(window)
        marks[slot] |= 2
        state.revisits_recent += 1

    # --- the rules: every rule that trips, in order; evidence that explains one rule away does
    # not explain away another (a repeated edit whose results changed once may still be part of
    # a run that keeps revisiting the same results) -----------------------------------------
    limits = policy.trip_limits
    if (
        hits < limits[0]
        and not state.runs
        and state.error_run < limits[1]
        and state.outcome_run < limits[2]
        and state.revisit_run < limits[3]
        and state.revisits_recent < limits[4]
        and state.failed_recent < limits[5]
    ):
        current = state.current
        if current is not None and current.verdict is _WORKING:  # the common case, inlined
            state.confirm_streak = 0
            return None
        return _quiet(state, call, index, policy, normalizer)

    return _judge(state, call, sig, key, hits, index, policy, normalizer, now_s, prior)


def _failure_step(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    args_key: int,
    index: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
) -> tuple[_Failure | None, bool, Assessment | None]:
    """Failure bookkeeping for a call that failed, was declared non-retryable, or may repeat a
    failure still in the window; decides ``retry_of_non_retryable``.

    Returns the signature's previous failure (if still in the window), whether the verdict is
    decided here, and if so what :func:`evaluate` returns.
    """
    window = policy.window
    failures = state.failures
    prior: _Failure | None = None
    if failures:
        prior = failures.get(args_key)
        if prior is not None and index - prior[4] >= window:
            # The failure is no longer among the last ``window`` calls (this call included).
            del failures[args_key]
            prior = None
    if prior is None and call.error_type is None and call.retryable is not False:
        return None, False, None
    if prior is not None and prior[1] is False and not sig.name_only:
        _remember_failure(state, args_key, call, prior, window)
        state.last_trip = index
        return prior, True, _set(
            state,
            Assessment(
                verdict=Verdict.STUCK,
                rule=Rule.RETRY_OF_NON_RETRYABLE,
                tool=call.tool,
                digest=sig.digest,
                hits=prior[3] + 1,
                period=1,
                window=window,
                call_index=index,
                reason=(
                    f"{call.tool} was called again with identical arguments after an error "
                    f"({prior[0] or 'unknown'}) marked non-retryable"
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
    prior: _Failure | None,
) -> Assessment | None:
    """The verdict after a call at which some rule may have tripped."""
    limits = policy.trip_limits
    trips: list[tuple[Rule, int, int, bool]] = []
    if hits >= policy.threshold:
        trips.append((Rule.REPETITION, 1, hits, False))
    elif state.runs and policy.max_period is not None:
        runs = state.runs
        # A cycle whose unit is one call repeated (all of its last p - 1 steps equal to their
        # predecessor) is period 1: the repetition rule's job.
        same = runs.get(1, 0)
        need = policy.min_repeats - 1
        for p in sorted(runs):
            run = runs[p]
            if p >= 2 and run >= need * p and same < p - 1:
                trips.append((Rule.PERIOD, p, run // p + 1, False))
                break
    if state.error_run >= limits[1]:
        trips.append((Rule.SAME_ERROR, 1, state.error_run, False))
    if state.outcome_run >= limits[2]:
        trips.append((Rule.SAME_RESULT, 1, state.outcome_run, False))
    if state.revisit_run >= limits[3]:
        trips.append((Rule.REVISIT, 1, state.revisit_run, False))
    elif state.revisits_recent >= limits[4]:
        trips.append((Rule.REVISIT, 1, state.revisits_recent, True))
    if state.failed_recent >= limits[5]:
        trips.append((Rule.FAILURES, 1, state.failed_recent, True))

    if not trips:  # only a period run that is not yet a cycle
        return _quiet(state, call, index, policy, normalizer)

    state.last_trip = index
    # The first rule not explained away decides; if every one is, the first one's "working" does.
    decisions = (
        _decide(state, call, sig, key, policy, normalizer, rule, period, rule_hits, index, now_s, prior, windowed)
        for rule, period, rule_hits, windowed in trips
    )
    assessment = next(decisions)
    if assessment.verdict is _WORKING:
        assessment = next((d for d in decisions if d.verdict is not _WORKING), assessment)
    if assessment.verdict is Verdict.STUCK and policy.confirm > 1:
        state.confirm_streak += 1
        if state.confirm_streak < policy.confirm:
            return None
    return _set(state, assessment)


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


def _track_revisit(state: RunState, policy: LoopPolicy, args_key: int, result_digest: str) -> bool:
    """Count consecutive calls whose (signature, result) pair was seen before in the run;
    True when this call is such a revisit."""
    seen = state.seen
    if seen is None:
        seen = state.seen = bytearray(8 * policy.revisit_memory)
    packed = ((args_key ^ hash(result_digest)) & _MASK64 or 1).to_bytes(8, "little")
    at = seen.find(packed)
    while at > 0 and at % 8:  # a match straddling two entries is no match
        at = seen.find(packed, at + 1)
    if at >= 0:
        state.revisit_run += 1
        return True
    state.revisit_run = 0
    slot = state.seen_at
    seen[slot * 8 : slot * 8 + 8] = packed
    state.seen_at = (slot + 1) % policy.revisit_memory
    return False


def _remember_failure(
    state: RunState,
    args_key: int,
    call: ToolCall,
    prior: _Failure | None,
    window: int,
) -> None:
    failures = state.failures
    if call.failed or call.retryable is False:
        if failures is None:
            failures = state.failures = {}
        attempts = prior[3] + 1 if prior is not None else 1
        failures.pop(args_key, None)  # re-insert: the dict's order is the failures' recency
        failures[args_key] = (call.error_type, call.retryable, call.end_s, attempts, state.calls)
        if len(failures) > window:
            # Bounded like the window: forget the oldest failure first.
            del failures[next(iter(failures))]
    elif prior is not None and failures is not None:
        failures.pop(args_key, None)


def _repeated_slots(
    state: RunState, key: int, rule: Rule, period: int, hits: int, window: int, windowed: bool
) -> list[int]:
    """Ring slots of the calls that form the repetition, oldest first."""
    index = state.calls
    if windowed:  # a share of the window: the whole window is the repetition
        return [(index - 1 - back) % window for back in range(min(index, window) - 1, -1, -1)]
    if rule is Rule.REPETITION:
        span = min(index, window)
        slots = [(index - 1 - back) % window for back in range(span - 1, -1, -1)]
        return [s for s in slots if state.keys[s] == key]
    span = min(index, window, period * hits if rule is Rule.PERIOD else hits)
    return [(index - 1 - back) % window for back in range(span - 1, -1, -1)]


def _decide(
    state: RunState,
    call: ToolCall,
    sig: Signature,
    key: int,
    policy: LoopPolicy,
    normalizer: Normalizer,
    rule: Rule,
    period: int,
    hits: int,
    index: int,
    now_s: float | None,
    prior: _Failure | None,
    windowed: bool = False,
) -> Assessment:
    window = policy.window

    def verdict(v: Verdict, reason: str) -> Assessment:
        return Assessment(
            verdict=v,
            rule=rule,
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
        )

    what = _describe(rule, call.tool, hits, period, window, windowed)

    # 1. a valid dependency lease
    lease = call.lease or state.lease
    if lease is not None:
        at = now_s if now_s is not None else (call.end_s if call.end_s is not None else call.start_s)
        if at is not None and lease.valid_at(at, policy.max_lease_renewals):
            return verdict(
                Verdict.WAITING,
                f"{what}, while {lease.owner} holds a lease until t={lease.deadline_s:g}",
            )

    # 2. a retry policy: the previous identical call failed with an error it covers, this is
    # attempt <= max_attempts, and the gap since that failure follows the schedule.
    retry = policy.retry_for(call.tool)
    if retry is not None and prior is not None and retry.covers(prior[0], prior[1]):
        attempt = call.attempt or prior[3] + 1
        if attempt <= retry.max_attempts:
            gap_ok = True
            if call.start_s is not None and prior[2] is not None:
                gap_ok = call.start_s - prior[2] >= retry.min_gap_s(attempt)
            if gap_ok:
                return verdict(
                    Verdict.RETRYING,
                    f"{what}; attempt {attempt} of {retry.max_attempts} after "
                    f"{prior[0] or 'a retryable error'}, inside the retry policy",
                )

    # 3. evidence
    slots = _repeated_slots(state, key, rule, period, hits, window, windowed)
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
        and rule not in _RESULTS_ARE_NOT_EVIDENCE
        and _results_changed(results, slots, rule, period)
    ):
        return verdict(Verdict.WORKING, f"{what}, but the results differ (new evidence)")
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
    return verdict(Verdict.STUCK, f"{what} with no new evidence")


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


def _describe(rule: Rule, tool: str, hits: int, period: int, window: int, windowed: bool = False) -> str:
    if rule is Rule.FAILURES:
        return f"{hits} of the last {window} calls, up to {tool}, failed"
    if rule is Rule.REVISIT and windowed:
        return (
            f"{hits} of the last {window} calls, ending with {tool}, each repeated an earlier call "
            "and got the same result"
        )
    if rule is Rule.PERIOD:
        return f"a cycle of {period} calls ending with {tool} repeated {hits}×"
    if rule is Rule.SAME_RESULT:
        return f"{hits} consecutive {tool} calls got the same result, whatever their arguments"
    if rule is Rule.REVISIT:
        return (
            f"{hits} consecutive calls, ending with {tool}, each repeated an earlier call and got "
            "the same result"
        )
    if rule is Rule.SAME_ERROR:
        return f"{hits} consecutive calls ending with {tool} failed with the same error"
    return f"{tool} repeated {hits}× with identical arguments in the last {window} calls"


# --- the compiled accelerator -------------------------------------------------------------------

PyRunState = RunState
"""The reference implementation of the per-run state (always importable)."""
py_evaluate = evaluate
"""The reference implementation of :func:`evaluate` (always importable)."""


_speedups = speedups()
if _speedups is not None:
    _speedups.bind(_failure_step, _judge, _quiet, _TOOL_ARGS, _WORKING)
COMPILED: Final = _speedups is not None
"""True when the compiled accelerator runs :func:`evaluate` (same verdicts, several times faster
per call); False means the pure-Python reference above runs."""
if not TYPE_CHECKING and _speedups is not None:
    RunState = _speedups.RunState
    evaluate = _speedups.evaluate
