"""The run guard: what an agent runner calls around every step and tool call.

A thin, thread-safe shell over :mod:`tripwire.core.budget` (limits, levels, checks) and
:mod:`tripwire.core.watch` (the loop watcher)::

    guard = Guard(Limits(max_steps=20, max_cost_usd=0.50, tool_caps={"send_email": 1}))
    guard.partial_answer = lambda snap: summarize(history)     # optional
    while True:
        advisory = guard.before_step()            # may raise BudgetExceeded
        if not advisory.ok:
            messages.append(system(advisory.message))
        reply = model(messages, tools=None if advisory.level == "restrict" else tools)
        guard.record_usage(model=reply.model, input_tokens=..., output_tokens=...)
        if not reply.tool_calls:
            guard.finish(); break
        batch = [(c.name, c.args) for c in reply.tool_calls]
        verdict = guard.before_tools(batch)       # the whole batch, before any of it runs
        if not verdict.allowed:                   # restricted or nudged: tell the model
            ...; continue
        for name, args in batch:
            result = guard.timeout(run_tool, None, name, args)
            guard.after_tool(name, args, ToolResult.success(result))   # may raise LoopDetected

The guard raises only :class:`~tripwire.errors.RunStopped` subclasses, on purpose:
:class:`~tripwire.errors.BudgetExceeded` (one :class:`StopReason`, the limit that fired, the
counters, the partial answer) and :class:`~tripwire.errors.LoopDetected`. Once it has raised,
the run is stopped: every later check raises the same exception again, and is counted
(:attr:`Guard.after_stop`), so a receipt never claims a stop the framework swallowed.
Everything else it returns as an :class:`~tripwire.core.budget.Advisory`.

Loops are refused, not reported: ``before_tool(s)`` asks the watcher
(:func:`tripwire.core.watch.preview`) whether the call would make the run ``stuck`` and raises
:class:`~tripwire.errors.LoopDetected` before the tool body runs. With ``on_loop="nudge"`` the
first such call is refused softly instead (an advisory naming what was repeated); the next
call at which a loop rule trips stops the run.

Thread-safety: one lock per guard; the ledger has its own. Asyncio: nothing awaits under the
lock and the in-process path never blocks, so the sync methods may be called from coroutines;
the ``a``-prefixed variants move calls to a worker thread when the ledger is remote (Redis).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, NoReturn, TypeVar

from tripwire.core import receipt as rc
from tripwire.core.budget import (
    NANO,
    NO_LIMITS,
    OK,
    Advisory,
    Charge,
    Level,
    Limits,
    RunCounters,
    Stop,
    charge_stop,
    check_before_step,
    check_duplicates,
    check_duration,
    check_usage,
    count_advisory,
    plan_subagent,
    plan_tool_calls,
    refused,
    usage_advisory,
)
from tripwire.core.events import ToolCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy, ResultEvidence
from tripwire.core.reasons import Rule, StopReason, Verdict, stop_reason_for
from tripwire.core.receipt import AfterStop, StopReceipt
from tripwire.core.results import ToolResult
from tripwire.core.signature import ABSENT, DEFAULT_NORMALIZER, Normalizer, Signature
from tripwire.core.watch import Assessment, RunState, evaluate, preview
from tripwire.errors import ConfigError, RunStopped
from tripwire.prices import PriceFn, Pricer, genai_price, usable_cost
from tripwire.store.base import Ledger, StoreUnavailable
from tripwire.store.memory import MemoryLedger

__all__ = ["Guard", "GuardSnapshot"]

OnLoop = Literal["stop", "nudge"]
"""What the guard does the first time a call would make the run ``stuck``: ``"stop"`` raises
:class:`~tripwire.errors.LoopDetected`; ``"nudge"`` refuses that call softly with a message for
the model, and stops the run at the next call at which a loop rule trips."""

_RETRY_ONLY: Final = LoopPolicy(
    name="retry-only",
    window=DEFAULT_POLICY.window,
    threshold=DEFAULT_POLICY.window,
    max_period=None,
    same_error=None,
    same_result=None,
    revisit=None,
    revisit_share=None,
    failure_share=None,
    result_evidence=ResultEvidence.OFF,
)
"""The watcher's policy when loop detection is off (``loop_policy=None``): the guard still
refuses an identical retry of a call that failed non-retryably (the watcher decides it, in one
place), and ignores every other rule."""

_SOFT_STOPS: Final = frozenset(
    {
        StopReason.MAX_TOOL_CALLS,
        StopReason.MAX_TOOL_CALLS_FOR_TOOL,
        StopReason.MAX_DUPLICATE_CALLS,
        StopReason.MAX_SUBAGENTS,
    }
)
"""Stops that refuse tool calls (or sub-agents) only: the model still gets one tool-less step
to give its final answer."""

_LIMIT_REASONS: Final = {
    "max_steps": StopReason.MAX_STEPS,
    "max_cost_usd": StopReason.MAX_COST,
    "max_input_tokens": StopReason.MAX_INPUT_TOKENS,
    "max_output_tokens": StopReason.MAX_OUTPUT_TOKENS,
    "max_total_tokens": StopReason.MAX_TOTAL_TOKENS,
    "max_duration_s": StopReason.MAX_DURATION,
    "max_no_progress_steps": StopReason.NO_PROGRESS,
}
"""The stop reason of each limit that can restrict the last step."""

_MAX_COUNT: Final = 1 << 62
"""Token counts at or above this are refused (``ConfigError``): ledgers count in 64 bits."""
_MAX_COST_USD: Final = 1e9
"""Reported costs at or above this (USD) are refused (``ConfigError``)."""
_MAX_TIMEOUT_S: Final = 86_400.0 * 365
"""Timeouts longer than a year are treated as no timeout (threading cannot wait longer)."""

_NUDGE_HINT: Final = "Try a different approach, or stop and report what you found."


def nudge_message(assessment: Assessment) -> str:
    """The message a nudge shows the model: what it repeated, in words, and what to do.

    Names the tool and the counts, never the arguments.
    """
    tool, hits = assessment.tool or "a tool", assessment.hits
    rule = assessment.rule
    if rule is Rule.RETRY_OF_NON_RETRYABLE:
        what = (
            f"You called {tool} again with the same arguments after it failed with an error "
            "that retrying cannot fix."
        )
    elif rule is Rule.PERIOD:
        what = (
            f"You repeated the same cycle of {assessment.period} tool calls, ending with {tool}, "
            f"{hits} times, and it returned the same results."
        )
    elif rule is Rule.SAME_ERROR:
        what = f"Your last {hits} tool calls, ending with {tool}, failed with the same error."
    elif rule is Rule.FAILURES:
        what = f"{hits} of your last {assessment.window} tool calls failed."
    elif rule is Rule.SAME_RESULT:
        what = f"You called {tool} {hits} times in a row and it returned the same result each time."
    elif rule is Rule.REVISIT:
        what = (
            f"Your last {hits} tool calls, ending with {tool}, repeated earlier calls and got "
            "the same results."
        )
    else:
        what = (
            f"You called {tool} with the same arguments {hits} times and it returned the same "
            "result."
        )
    return f"{what} {_NUDGE_HINT}"

logger = logging.getLogger("tripwire.guard")

_T = TypeVar("_T")
_PENDING_MAX: Final = 1024

def _shown(value: Any) -> Any:
    """``value`` for an error message: an integer too long to print is described instead."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    return value


_UNFINISHED_WARNED = threading.Event()


def _warn_unfinished() -> None:
    """Warn once per process that a receipt was built for a run with no recorded end."""
    if _UNFINISHED_WARNED.is_set():
        return
    _UNFINISHED_WARNED.set()
    warnings.warn(
        "guard.receipt() was called for a run that was neither stopped nor finished, so the "
        "receipt has no stop reason and explains as 'uncertain': call guard.finish() when the "
        "model answers (or pass receipt(..., reason=...))",
        UserWarning,
        stacklevel=3,
    )


def _nudge_advisory(assessment: Assessment) -> Advisory:
    """The soft refusal a nudge hands the model instead of running the call."""
    return Advisory(
        level=Level.RESTRICT,
        message=nudge_message(assessment),
        limit_name="loop",
        remaining=None,
        allowed=False,
    )


def _wrap_up(stop: Stop, limits: Limits) -> Advisory:
    """The advisory of the tool-less last step after a tool-call cap stopped the run."""
    limit = int(stop.limit) if float(stop.limit).is_integer() else stop.limit
    left = f"No tool calls left ({stop.limit_name}={limit} reached)"
    return Advisory(
        level=Level.RESTRICT,
        message=limits.messages.restrict.format(
            left=left, limit_name=stop.limit_name, limit=limit, used=limit, remaining=0
        ),
        limit_name=stop.limit_name,
        remaining=0,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardSnapshot:
    """The guard's state at one moment: counters, and why the run stopped (if it did)."""

    run_id: str
    counters: RunCounters
    """What the run consumed (shared counters include sub-agents' use)."""
    reason: StopReason | None
    """Why the run stopped; ``None`` while it runs."""
    stop: Stop | None
    """The budget limit that fired, with its values (``None`` unless a budget stopped it)."""
    loop: Assessment | None
    """The loop assessment that stopped the run (or refused a non-retryable retry)."""
    verdict: Verdict
    """The loop watcher's verdict in force (``working`` when the watcher is off)."""
    policy_version: str | None
    normalizer_version: str
    limits: Limits
    nudge: Assessment | None = None
    """The loop assessment a nudge was given for (``on_loop="nudge"``), else ``None``."""
    after_stop_model_calls: int = 0
    """Model calls attempted after the guard stopped the run (the framework went on)."""
    after_stop_tool_calls: int = 0
    """Tool calls attempted after the guard stopped the run (the framework went on)."""

    @property
    def condition(self) -> dict[str, str | int | float | bool | None]:
        """The inputs of the condition that fired, e.g. ``{"tool_calls": 20, "requested": 1,
        "max_tool_calls": 20}`` (empty while running)."""
        if self.stop is not None:
            return self.stop.condition
        if self.loop is not None:
            a = self.loop
            out: dict[str, str | int | float | bool | None] = {
                "rule": a.rule.value if a.rule else None,
                "tool": a.tool,
                "hits": a.hits,
                "window": a.window,
                "period": a.period,
                "call_index": a.call_index,
            }
            if self.nudge is not None:
                out["nudged_at_call"] = self.nudge.call_index
            return out
        if self.nudge is not None:
            return {"nudged_at_call": self.nudge.call_index}
        return {}


@dataclass(frozen=True, slots=True)
class _Scope:
    key: str
    """Ledger counter prefix of this run (``{root}:`` or ``{root}:1:2:``)."""
    limits: Limits
    start_s: float
    deadline_s: float | None
    restrict_s: float | None
    """When the duration budget reaches its restrict level."""


_Plan = tuple[list[tuple[str, int, int | None]], list[tuple[int, Charge, float | None]], bool]


class Guard:
    """Enforces one run's budgets and stops loops; shares budgets with its sub-agents.

    Args:
        limits: the run's :class:`~tripwire.core.budget.Limits` (default: none, only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        normalizer: the signature normalizer (tool + arguments → signature).
        clock: monotonic seconds (injectable for tests).
        ledger: where shared counters live: a :class:`~tripwire.store.memory.MemoryLedger`
            (default, one per root guard) or a :class:`~tripwire.store.redis.RedisLedger` to
            share one budget across processes (give every process the same ``run_id``).
        prices: ``(model, provider, input_tokens, output_tokens) -> USD | None``; default the
            ``genai-prices`` table; ``None`` prices nothing (report ``cost_usd`` yourself).
        run_id: the run's id (default a random one); the ledger key of its counters.
        on_loop: ``"stop"`` (default) raises :class:`~tripwire.errors.LoopDetected` before a
            call that would make the run ``stuck`` runs; ``"nudge"`` refuses the first such
            call softly (``Advisory(allowed=False, limit_name="loop")`` naming what was
            repeated) and stops the run at the next call at which a loop rule trips.
    """

    _children: int
    partial_answer: Callable[[GuardSnapshot], Any] | None
    """A hook the runner sets to build a partial answer from the run state; called once when
    the guard stops the run, its result travels on the exception as ``exc.partial``."""

    def __init__(
        self,
        limits: Limits = NO_LIMITS,
        *,
        loop_policy: LoopPolicy | None = DEFAULT_POLICY,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
        prices: PriceFn | None = genai_price,
        run_id: str | None = None,
        on_loop: OnLoop = "stop",
        _parent: Guard | None = None,
    ) -> None:
        if not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a tripwire Limits")
        if loop_policy is not None and not isinstance(loop_policy, LoopPolicy):
            raise ConfigError("loop_policy", loop_policy, "a LoopPolicy or None")
        if on_loop not in ("stop", "nudge"):
            raise ConfigError("on_loop", on_loop, "'stop' or 'nudge'")
        self.limits = limits
        self.loop_policy = loop_policy
        self.on_loop: OnLoop = on_loop
        self.normalizer = normalizer
        self.run_id = run_id or uuid.uuid4().hex
        self.partial_answer = None
        self._clock = clock
        self._prices = prices
        self._lock = threading.RLock()
        self._started_at = time.time()
        """Wall-clock start (Unix seconds), for receipts; durations use ``clock``."""
        start = clock()
        deadline = restrict_at = None
        if limits.max_duration_s is not None:
            deadline = start + limits.max_duration_s
            if limits.levels.restrict is not None:
                restrict_at = start + limits.max_duration_s * limits.levels.restrict
        if _parent is None:
            self._ledger: Ledger = ledger if ledger is not None else MemoryLedger()
            key = "{" + self.run_id + "}:"
            parents: tuple[_Scope, ...] = ()
            self._tools_seen: set[str] = set()
        else:
            self._ledger = _parent._ledger
            key = f"{_parent._chain[0].key}{_parent._children}:"
            parents = _parent._chain
            self._tools_seen = _parent._tools_seen
        self._chain: tuple[_Scope, ...] = (
            _Scope(key, limits, start, deadline, restrict_at),
            *parents,
        )
        self._restrict_at = min(
            (s.restrict_s for s in self._chain if s.restrict_s is not None), default=float("inf")
        )
        self._deadlines = tuple(s for s in self._chain if s.deadline_s is not None)
        self._timed = bool(self._deadlines)
        self._digest_all = loop_policy is not None and (
            loop_policy.revisit is not None or loop_policy.result_evidence is ResultEvidence.ALL
        )
        """Whether results of every tool are digested for the loop watcher (else only the
        polling tools', when results count as evidence for them)."""
        self._dup_cap = limits.max_duplicate_calls
        self._watch_policy = loop_policy if loop_policy is not None else _RETRY_ONLY
        """The watcher's policy; with loop detection off, only retry-of-non-retryable counts."""
        self._state = RunState.new(self._watch_policy)
        self._loops = loop_policy is not None
        self._steps = 0
        self._children = 0
        self._dups: dict[int, int] = {}
        self._pending: dict[tuple[str, int], tuple[Any, Signature]] = {}
        self._inflight = 0
        """Tool calls allowed whose ``after_tool`` has not come yet (a batch still running)."""
        self._nudge: Assessment | None = None
        self._nudge_due: Advisory | None = None
        """A nudge decided in ``after_tool``, handed out by the next ``before_tool(s)``."""
        self._last_step: tuple[Advisory, Limits] | None = None
        """Set while the step ``before_step`` restricted runs: the run's last step."""
        self._final: Stop | None = None
        """The limit the run ends on after its last step (the stop reason; raised next step)."""
        self._after_model = 0
        self._after_tools = 0
        self._step_after_stop = False
        """A ``before_step`` after the stop was counted; its usage report is the same call."""
        self._refused_after_stop = 0
        """Tool calls refused after the stop whose ``after_tool`` may still come."""
        self._plans: dict[str, _Plan] = {}
        self._last_progress: str | None = None
        self._no_progress = 0
        self._unpriced = 0
        self._pricer = Pricer(prices)
        self._restricted: Advisory | None = None
        self._cause: Stop | Assessment | None = None
        self._finished: StopReason | None = None
        self._ended_s: float | None = None
        self._exc: RunStopped | None = None
        self.hook_errors = 0
        """How many times the partial-answer hook raised (logged, then ignored)."""

    # -- steps ------------------------------------------------------------------------------

    def before_step(self) -> Advisory:
        """Call before each model call. Counts the step, or refuses it.

        A ``restrict`` advisory makes this step the run's last: call the model without tools
        and keep its answer. Its :meth:`record_usage` never raises (the step may cross the
        limit), the run's stop reason becomes the limit concerned, and the next
        ``before_step`` raises. A tool-call cap (``max_tool_calls``, per-tool caps,
        duplicates, sub-agents) never refuses a step: once one stopped the run, the next step
        is that tool-less last step.

        Returns:
            The most severe advisory: ``advise`` (show the message), ``restrict`` (this is the
            last step: call the model without tools; tool calls are refused), or ``ok``.

        Raises:
            BudgetExceeded: the step would exceed ``max_steps``; or the deadline passed; or
                ``max_no_progress_steps`` consecutive steps made no progress; or tokens/cost
                already reached a limit (e.g. spent by a sub-agent); or the previous step was
                the last.
            RunStopped: the run was already stopped (counted in :attr:`after_stop`).
        """
        now = self._clock()
        with self._lock:
            last, self._last_step = self._last_step, None
            cause = self._cause
            if cause is not None:
                if last is None and isinstance(cause, Stop) and cause.reason in _SOFT_STOPS:
                    self._last_step = wrap = (_wrap_up(cause, self.limits), self.limits)
                    self._steps += 1
                    self._restricted = None
                    return wrap[0]
                self._after_model += 1
                self._step_after_stop = True
                self._raise_if_stopped()
            shared = self._read_usage()
            worst, worst_limits = OK, self.limits
            stop: Stop | None = None
            for i, scope in enumerate(self._chain):
                counters = self._usage_counters(i, shared, now)
                if i == 0:
                    result = check_before_step(scope.limits, counters)
                else:
                    result = (
                        check_duration(scope.limits, counters.elapsed_s)
                        or check_usage(scope.limits, counters)
                        or usage_advisory(scope.limits, counters)
                    )
                if isinstance(result, Stop):
                    stop = result
                    break
                if worst.worse(result) is not worst:
                    worst, worst_limits = result, scope.limits
            if last is not None:
                # The previous step was the last: the run ends on the limit it was told about.
                self._stop_with(self._final or stop or self._last_stop(*last), now)
            if stop is not None:
                self._stop_with(stop, now)
            self._steps += 1
            if worst.level is Level.RESTRICT:
                self._last_step = (worst, worst_limits)
                self._restricted = refused(worst_limits, worst)
            else:
                self._restricted = None
            return worst

    def progress(self, fingerprint: str) -> None:
        """Report the task's progress fingerprint once per step (e.g. a digest of the facts
        found so far). A step whose fingerprint equals the previous one made no progress."""
        with self._lock:
            if self._last_progress is not None and fingerprint == self._last_progress:
                self._no_progress += 1
            else:
                self._no_progress = 0
            self._last_progress = fingerprint

    # -- tool calls -------------------------------------------------------------------------

    def before_tool(self, tool: str, arguments: Any = ABSENT) -> Advisory:
        """Call before running one tool call; see :meth:`before_tools` (the hot path)."""
        now = self._clock() if self._timed else 0.0
        with self._lock:
            if self._cause is not None:
                self._refuse_after_stop(1)
            if self._timed:
                self._check_time(now)
            if self._restricted is not None:
                return self._restricted
            if self._nudge_due is not None:
                return self._hand_out_nudge()
            sig: Signature | None = None
            if self._loops or self._dup_cap is not None or self._state.failures:
                sig = self.normalizer.signature(tool, arguments)
                if self._loops or self._state.failures:
                    nudge = self._preview((sig,), now)
                    if nudge is not None:
                        return nudge
                if self._dup_cap is not None and self._dups.get(sig.key, 0) >= self._dup_cap:
                    stop = check_duplicates(self.limits, self._dups, ((tool, sig.key),))
                    assert stop is not None
                    self._stop_with(stop, now)
            plan = self._plans.get(tool)
            if plan is None:
                plan = self._plans[tool] = self._plan((tool,))
            # What follows is _reserve() for a batch of one, inlined: this runs before every
            # tool call, and going through _reserve's batch loops costs ~0.65 µs (bench_guard).
            items, meta, capped = plan
            try:
                index, totals = self._ledger.reserve(items)
            except StoreUnavailable:
                self._unavailable_for(meta, now)
            if index >= 0:
                self._stop_with(charge_stop(meta[index][1], totals[index]), now)
            self._inflight += 1
            if tool not in self._tools_seen:
                self._tools_seen.add(tool)
            if sig is not None:
                self._dups[sig.key] = self._dups.get(sig.key, 0) + 1
                pending = self._pending
                if len(pending) >= _PENDING_MAX:
                    pending.clear()
                pending[(tool, id(arguments))] = (arguments, sig)
            if not capped:
                return OK
            worst = OK
            for i, (scope_index, charge, threshold) in enumerate(meta):
                if threshold is not None and totals[i] >= threshold:
                    adv = count_advisory(self._chain[scope_index].limits, charge, totals[i])
                    if adv is not None:
                        worst = worst.worse(adv)
            return worst

    def before_tools(self, calls: Iterable[tuple[str, Any]]) -> Advisory:
        """Call before running a batch of tool calls (a parallel batch as a whole).

        Either the whole batch is allowed (and counted), or none of it: a batch that would
        take any cap over its limit is refused before any of it runs.

        Returns:
            An advisory. ``allowed=False`` means the calls must not run; give the model
            ``message`` instead. Either the run is restricted (nearly out of steps, tokens,
            cost or time: ``limit_name`` is that limit), or, with ``on_loop="nudge"``, a call
            would have made the run ``stuck`` (``limit_name="loop"``; the message names what
            was repeated; the refusal is not sticky). Otherwise the calls are counted, and the
            advisory may say how many are left.

        Raises:
            BudgetExceeded: a cap (per tool, duplicates, total) would be exceeded, or the
                deadline passed.
            LoopDetected: a call would make the run ``stuck`` (the 4th identical call with the
                same result, a cycle, ...), or repeats with identical arguments a call that
                failed with ``retryable=False`` (reason ``retry_of_non_retryable``); raised
                before the call runs. With ``on_loop="nudge"``, from the second time on.
            RunStopped: the run was already stopped (counted in :attr:`after_stop`).
        """
        batch = list(calls)
        if len(batch) == 1:
            return self.before_tool(*batch[0])
        now = self._clock()
        with self._lock:
            if self._cause is not None:
                self._refuse_after_stop(len(batch))
            self._check_time(now)
            if self._restricted is not None:
                return self._restricted
            if not batch:
                return OK
            if self._nudge_due is not None:
                return self._hand_out_nudge()
            sigs: list[Signature] | None = None
            if self._loops or self._dup_cap is not None or self._state.failures:
                sigs = [self.normalizer.signature(tool, args) for tool, args in batch]
                if self._loops or self._state.failures:
                    nudge = self._preview(sigs, now)
                    if nudge is not None:
                        return nudge
                stop = check_duplicates(self.limits, self._dups, [(s.tool, s.key) for s in sigs])
                if stop is not None:
                    self._stop_with(stop, now)
            plan = self._plan([tool for tool, _ in batch])
            return self._reserve(plan, batch, sigs, now)

    def _preview(self, sigs: Sequence[Signature], now: float) -> Advisory | None:
        """Ask the watcher whether any call would make the run ``stuck``; stop, or nudge."""
        state, policy = self._state, self._watch_policy
        for sig in sigs:
            found = preview(state, sig.tool, sig, policy, self.normalizer)
            if found is None or (not self._loops and found.rule is not Rule.RETRY_OF_NON_RETRYABLE):
                continue
            if self.on_loop == "nudge" and self._nudge is None:
                self._nudge = found
                return _nudge_advisory(found)
            self._stop_with(found, now)
        return None

    def _hand_out_nudge(self) -> Advisory:
        nudge = self._nudge_due
        assert nudge is not None
        self._nudge_due = None
        return nudge

    def _refuse_after_stop(self, calls: int) -> NoReturn:
        """A tool call (or batch) after the stop: the framework went on. Count it, raise."""
        self._after_tools += calls
        self._refused_after_stop += calls
        self._raise_if_stopped()
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_time(self, now: float) -> None:
        for scope in self._deadlines:
            stop = check_duration(scope.limits, now - scope.start_s, "tool call")
            if stop is not None:
                self._stop_with(stop, now)
        if now >= self._restrict_at and self._restricted is None:
            refusal = self._time_refusal(now)
            if not refusal.allowed:
                self._restricted = refusal

    def _reserve(
        self,
        plan: _Plan,
        batch: Sequence[tuple[str, Any]],
        sigs: Sequence[Signature | None] | None,
        now: float,
    ) -> Advisory:
        items, meta, capped = plan
        try:
            index, totals = self._ledger.reserve(items)
        except StoreUnavailable:
            self._unavailable_for(meta, now)
        if index >= 0:
            self._stop_with(charge_stop(meta[index][1], totals[index]), now)
        self._inflight += len(batch)
        seen = self._tools_seen
        for tool, _ in batch:
            if tool not in seen:
                seen.add(tool)
        if sigs is not None:
            dups, pending = self._dups, self._pending
            if len(pending) >= _PENDING_MAX:
                pending.clear()
            for sig, (tool, args) in zip(sigs, batch, strict=True):
                if sig is not None:
                    dups[sig.key] = dups.get(sig.key, 0) + 1
                    pending[(tool, id(args))] = (args, sig)
        if not capped:
            return OK
        worst = OK
        for (scope_index, charge, threshold), total in zip(meta, totals, strict=True):
            if threshold is not None and total >= threshold:
                adv = count_advisory(self._chain[scope_index].limits, charge, total)
                if adv is not None:
                    worst = worst.worse(adv)
        return worst

    def after_tool(
        self,
        tool: str,
        arguments: Any = ABSENT,
        result: ToolResult | None = None,
        *,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> Assessment | None:
        """Call after a tool call ran, with its result; feeds the loop watcher.

        A failure with ``retryable=False`` makes an identical later call refused before it
        runs (the watcher remembers it for a window of calls).

        Returns:
            The loop watcher's assessment when its verdict changed at this call (e.g.
            ``uncertain``; with ``on_loop="nudge"``, the ``stuck`` assessment a nudge is given
            for, handed to the model by the next ``before_tool(s)``), else ``None``.

        Raises:
            LoopDetected: the loop policy says the run is ``stuck`` (with ``on_loop="nudge"``,
                after the nudge: at any call where a loop rule trips).
            RunStopped: a tool body ran after the run was stopped (counted in
                :attr:`after_stop`); a call allowed before the stop that finishes after it
                returns ``None``.
        """
        with self._lock:
            if self._inflight:
                self._inflight -= 1
            elif self._cause is not None:
                if self._refused_after_stop:
                    self._refused_after_stop -= 1  # counted when it was refused
                else:
                    self._after_tools += 1
                self._raise_if_stopped()
            if self._cause is not None:
                return None  # a call of a batch that finished after the run stopped
            state, policy = self._state, self._watch_policy
            failed = result is not None and not result.ok
            if not self._loops and not failed and not state.failures:
                return None
            entry = self._pending.pop((tool, id(arguments)), None) if self._pending else None
            if entry is not None and entry[0] is arguments:
                sig = entry[1]
            else:
                sig = self.normalizer.signature(tool, arguments)
            error_type: str | None = None
            retryable: bool | None = None
            digest: str | None = None
            progress: str | None = None
            if result is not None:
                if not result.ok:
                    error_type, retryable = result.code, result.retryable
                progress = result.progress
                if result.value is not None and self._loops and (
                    self._digest_all or tool in policy.polling_tools
                ):
                    digest = self.normalizer.result_digest(result.value)
            call = ToolCall(
                tool=tool,
                start_s=start_s,
                end_s=end_s,
                error_type=error_type,
                retryable=retryable,
                result_digest=digest,
                progress=progress,
            )
            assessment = evaluate(state, call, policy, self.normalizer, signature=sig)
            if not self._loops:
                if assessment is not None and assessment.rule is Rule.RETRY_OF_NON_RETRYABLE:
                    self._stop_with(assessment, self._clock())
                return None
            stuck = assessment is not None and assessment.verdict is Verdict.STUCK
            if self._nudge is not None and not stuck:
                # After the nudge, any trip that is not explained away stops the run, even
                # when the verdict did not change.
                current = state.current
                stuck = (
                    state.last_trip == state.calls
                    and current is not None
                    and current.verdict is Verdict.STUCK
                )
                if stuck:
                    assessment = current
            if stuck:
                assert assessment is not None
                if self.on_loop == "nudge" and self._nudge is None:
                    self._nudge = assessment
                    self._nudge_due = _nudge_advisory(assessment)
                    return assessment
                self._stop_with(assessment, self._clock())
            return assessment

    # -- usage ------------------------------------------------------------------------------

    def record_usage(
        self,
        *,
        model: str | None = None,
        input_tokens: int = 0,
        output_tokens: int = 0,
        cost_usd: float | None = None,
        provider: str | None = None,
    ) -> Advisory:
        """Report one model call's usage (after it returned). Checks tokens and cost.

        The cost is ``cost_usd`` when given, else priced from ``model`` with the price
        function (``genai-prices``). An unknown price is never counted as $0 silently: the
        call is counted in ``unpriced_calls`` and a :class:`CostNotFoundWarning` is issued once
        per model; ``max_cost_usd`` cannot be enforced for such calls.

        In the run's last step (``before_step`` returned ``restrict``) this never raises: the
        usage is recorded even when it crosses a limit, and the run's stop reason becomes
        that limit (the next ``before_step`` raises it).

        Returns:
            The most severe advisory from tokens, cost and time; at ``restrict`` further tool
            calls are refused.

        Raises:
            BudgetExceeded: a token or cost total reached its limit (``>=``).
            ConfigError: a token count is not an integer ``>= 0`` (below 2**62), or
                ``cost_usd`` is not a finite number ``>= 0`` (below 1e9).
            RunStopped: the run was already stopped (counted in :attr:`after_stop`).
        """
        for name, value in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 0
                or value >= _MAX_COUNT
            ):
                raise ConfigError(name, _shown(value), "an integer >= 0 and below 2**62")
        if cost_usd is not None:
            usable = usable_cost(cost_usd)
            if usable is None or usable >= _MAX_COST_USD:
                raise ConfigError("cost_usd", cost_usd, "a finite number >= 0 and below 1e9, or None")
            cost: float | None = usable
        else:
            cost = self._price(model, provider, input_tokens, output_tokens)
        nano = round(cost * NANO) if cost is not None else 0
        now = self._clock()
        with self._lock:
            last = self._last_step
            if self._cause is not None and last is None:
                if self._step_after_stop:
                    self._step_after_stop = False  # the step already counted
                else:
                    self._after_model += 1
                self._raise_if_stopped()
            if cost is None:
                self._unpriced += 1
            items: list[tuple[str, int]] = []
            for scope in self._chain:
                k = scope.key
                items += (
                    (k + "input_tokens", input_tokens),
                    (k + "output_tokens", output_tokens),
                    (k + "cost_nusd", nano),
                )
            try:
                totals = self._ledger.add(items)
            except StoreUnavailable:
                if last is not None:
                    return last[0]
                reason, name = self._usage_reason()
                self._unavailable(reason, name, now)
            worst, worst_limits = OK, self.limits
            for i, scope in enumerate(self._chain):
                counters = RunCounters(
                    input_tokens=totals[3 * i],
                    output_tokens=totals[3 * i + 1],
                    cost_usd=totals[3 * i + 2] / NANO,
                    elapsed_s=now - scope.start_s,
                )
                stop = check_usage(scope.limits, counters)
                if stop is not None:
                    if last is None:
                        self._stop_with(stop, now)
                    if self._final is None:
                        self._final = stop  # the last step crossed it: allowed, and recorded
                    continue
                adv = usage_advisory(scope.limits, counters)
                if worst.worse(adv) is not worst:
                    worst, worst_limits = adv, scope.limits
            if last is not None:
                if self._final is None and self._cause is None:
                    self._final = self._last_stop(*last)
                return last[0]
            if worst.level is Level.RESTRICT:
                self._restricted = refused(worst_limits, worst)
            return worst

    def _last_stop(self, advisory: Advisory, limits: Limits) -> Stop:
        """The stop a run ends on after the last step ``advisory`` restricted."""
        name = advisory.limit_name or ""
        if name == "max_steps":
            natural = check_before_step(
                replace(limits, max_duration_s=None), RunCounters(steps=self._steps)
            )
            if isinstance(natural, Stop):
                return natural
        limit = getattr(limits, name, None)
        value = float(limit) if isinstance(limit, (int, float)) else 0.0
        remaining = advisory.remaining if advisory.remaining is not None else 0.0
        used = max(value - remaining, 0.0)
        return Stop(
            reason=_LIMIT_REASONS.get(name, StopReason.MAX_STEPS),
            limit_name=name,
            limit=value,
            observed=used,
            counter=name.removeprefix("max_"),
            used=used,
            message=(
                f"The run's last step ran near its {name} limit and was told to answer without "
                f"tools; the run ends there. Raise Limits({name}=...) for longer runs"
            ),
        )

    # -- sub-agents -------------------------------------------------------------------------

    def subagent(
        self, limits: Limits = NO_LIMITS, *, loop_policy: LoopPolicy | str | None = "inherit"
    ) -> Guard:
        """Start a sub-agent: a child guard that spends from this run's budget.

        The child has its own ``limits`` (for it alone, e.g. tighter) and also consumes
        from every ancestor's shared counters (tool calls, per-tool counts, tokens, cost,
        sub-agents) and deadline, through the same ledger. Steps, duplicates and the
        no-progress streak are per run.

        Raises:
            BudgetExceeded: ``max_subagents`` (of this run or an ancestor) would be exceeded.
        """
        now = self._clock()
        with self._lock:
            self._raise_if_stopped()
            items = [(s.key + "subagents", 1, s.limits.max_subagents) for s in self._chain]
            try:
                index, totals = self._ledger.reserve(items)
            except StoreUnavailable:
                self._unavailable(StopReason.MAX_SUBAGENTS, "max_subagents", now)
            if index >= 0:
                charge = plan_subagent(self._chain[index].limits)
                self._stop_with(charge_stop(charge, totals[index]), now)
            self._children += 1
            policy = self.loop_policy if loop_policy == "inherit" else loop_policy
            if isinstance(policy, str):
                raise ConfigError("loop_policy", policy, "a LoopPolicy, None or 'inherit'")
            return Guard(
                limits,
                loop_policy=policy,
                normalizer=self.normalizer,
                clock=self._clock,
                prices=self._prices,
                run_id=f"{self.run_id}/{self._children}",
                on_loop=self.on_loop,
                _parent=self,
            )

    # -- timeouts ---------------------------------------------------------------------------

    def timeout(
        self, fn: Callable[..., _T], seconds: float | None = None, /, *args: Any, **kwargs: Any
    ) -> _T:
        """Run ``fn(*args, **kwargs)`` with a timeout, in a worker thread.

        The timeout is ``seconds`` (default ``limits.tool_timeout_s``), shortened to what is
        left of the run's deadline. A timeout longer than a year (``float("inf")`` included)
        is no timeout: ``fn`` runs on the caller's thread. Python cannot kill a thread: on
        timeout the call is abandoned (a daemon thread) and the run stops. Exceptions of
        ``fn`` propagate as is.

        Raises:
            BudgetExceeded: reason ``max_duration``; ``limit_name`` is ``tool_timeout_s``
                for the tool's own timeout, ``max_duration_s`` when the run deadline cut it.
        """
        limit, name, now = self._timeout_for(seconds)
        if limit is None:
            return fn(*args, **kwargs)
        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed back to the caller's thread below
                box["error"] = exc
            finally:
                done.set()

        ctx = contextvars.copy_context()
        label = getattr(fn, "__name__", "tool")
        threading.Thread(
            target=ctx.run, args=(target,), daemon=True, name=f"tripwire-{label}"
        ).start()
        if not done.wait(max(limit, 0.0)):
            self._timed_out(label, limit, name, now)
        if "error" in box:
            raise box["error"]
        return box["value"]  # type: ignore[no-any-return]

    async def atimeout(self, awaitable: Awaitable[_T], seconds: float | None = None) -> _T:
        """Await ``awaitable`` with a timeout (``asyncio.wait_for``); see :meth:`timeout`."""
        limit, name, now = self._timeout_for(seconds)
        if limit is None:
            return await awaitable
        try:
            return await asyncio.wait_for(awaitable, max(limit, 0.0))
        except asyncio.TimeoutError:
            label = getattr(awaitable, "__qualname__", None) or "tool"
            self._timed_out(str(label), limit, name, now)

    # -- async variants ---------------------------------------------------------------------

    async def abefore_step(self) -> Advisory:
        """:meth:`before_step` without blocking the event loop on a remote ledger."""
        return await self._offload(self.before_step)

    async def abefore_tools(self, calls: Iterable[tuple[str, Any]]) -> Advisory:
        """:meth:`before_tools` without blocking the event loop on a remote ledger."""
        batch = list(calls)
        return await self._offload(lambda: self.before_tools(batch))

    async def abefore_tool(self, tool: str, arguments: Any = ABSENT) -> Advisory:
        """:meth:`before_tool` without blocking the event loop on a remote ledger."""
        return await self._offload(lambda: self.before_tool(tool, arguments))

    async def arecord_usage(self, **usage: Any) -> Advisory:
        """:meth:`record_usage` without blocking the event loop on a remote ledger."""
        return await self._offload(lambda: self.record_usage(**usage))

    async def _offload(self, fn: Callable[[], _T]) -> _T:
        if self._ledger.remote:
            return await asyncio.to_thread(fn)
        return fn()

    # -- end of run -------------------------------------------------------------------------

    def finish(self, reason: StopReason = StopReason.COMPLETED) -> None:
        """Record how the run ended when the guard did not stop it (completed, cancelled…).

        After a last step (``before_step`` returned ``restrict``) the stop reason stays the
        limit that step was told about.
        """
        with self._lock:
            if self._cause is None and self._finished is None:
                self._finished = reason
                self._ended_s = self._clock()
                if self._last_step is not None and self._final is None:
                    self._final = self._last_stop(*self._last_step)

    @property
    def after_stop(self) -> AfterStop | None:
        """What the agent attempted after the guard stopped the run (the framework swallowed
        the stop and went on): model calls and tool calls, or ``None`` while the run has not
        been stopped. The receipt carries it, so it never claims a stop that did not happen."""
        with self._lock:
            if self._cause is None:
                return None
            return AfterStop(model_calls=self._after_model, tool_calls=self._after_tools)

    @property
    def nudged(self) -> Assessment | None:
        """The loop assessment a nudge was given for (``on_loop="nudge"``), else ``None``."""
        return self._nudge

    @property
    def stopped(self) -> RunStopped | None:
        """The exception that stopped the run, or ``None``."""
        return self._exc

    @property
    def reason(self) -> StopReason | None:
        """Why the run stopped or ended (``None`` while it runs)."""
        cause = self._cause
        if isinstance(cause, Stop):
            return cause.reason
        if isinstance(cause, Assessment):
            return stop_reason_for(cause.rule)
        if self._final is not None:
            return self._final.reason
        return self._finished

    def snapshot(self) -> GuardSnapshot:
        """The counters and stop information now (reads the shared ledger)."""
        with self._lock:
            return self._snapshot(self._clock())

    def receipt(
        self,
        agent: str,
        *,
        end: Any = None,
        reason: StopReason | None = None,
        **fields: Any,
    ) -> StopReceipt:
        """A :class:`~tripwire.core.receipt.StopReceipt` built from the guard's state.

        Times are wall-clock (``started_at``, ``ended_at`` in Unix seconds); the duration
        comes from the guard's monotonic clock. Activity after a stop is carried as
        ``after_stop``, so the receipt never claims a stop the framework swallowed.

        Args:
            agent: the agent's name.
            end: an ``EndKind``; default derived from the stop reason (a budget or loop stop
                is ``stop_condition``, ``max_duration`` is ``timeout``, ``completed`` is
                ``natural_finish``…).
            reason: the stop reason, when the guard did not record one (e.g. the runner knows
                the user cancelled); default the guard's (:attr:`reason`). A run that was
                neither stopped nor finished has none: call :meth:`finish` when the model
                answers, or its receipt explains as ``uncertain``.
            **fields: further ``StopReceipt`` fields (``outcomes``, ``requires_outcome``…).
        """
        with self._lock:
            snap = self._snapshot(self._clock())
            after = self.after_stop
        if reason is None:
            reason = snap.reason
        elif not isinstance(reason, StopReason):
            raise ConfigError("reason", reason, "a StopReason or None")
        if reason is None:
            _warn_unfinished()
        if end is None and reason is not None:
            end = {
                StopReason.COMPLETED: rc.EndKind.NATURAL_FINISH,
                StopReason.USER_CANCELLED: rc.EndKind.USER_ABORT,
                StopReason.MAX_DURATION: rc.EndKind.TIMEOUT,
                StopReason.TOOL_ERROR: rc.EndKind.TOOL_FAILURE,
                StopReason.APPROVAL_REQUIRED: rc.EndKind.APPROVAL_REQUESTED,
            }.get(reason, rc.EndKind.STOP_CONDITION)
        c = snap.counters
        counters = rc.Counters(
            steps=c.steps,
            tool_calls=c.tool_calls,
            input_tokens=c.input_tokens,
            output_tokens=c.output_tokens,
            cost_usd=None if c.unpriced_calls and not c.cost_usd else c.cost_usd,
            duration_s=c.elapsed_s,
        )
        extra: dict[str, Any] = {}
        if after is not None and "after_stop" not in fields:
            extra["after_stop"] = after
        return rc.StopReceipt(
            run_id=self.run_id,
            agent=agent,
            end=end,
            reason=reason,
            condition=snap.condition,
            policy_version=snap.policy_version,
            normalizer_version=snap.normalizer_version,
            counters=counters,
            verdict=snap.verdict,
            started_at=self._started_at,
            ended_at=self._started_at + c.elapsed_s,
            **extra,
            **fields,
        )

    # -- internals --------------------------------------------------------------------------

    def _plan(self, tools: Sequence[str]) -> _Plan:
        items: list[tuple[str, int, int | None]] = []
        meta: list[tuple[int, Charge, float | None]] = []
        capped = False
        for i, scope in enumerate(self._chain):
            advise = scope.limits.levels.advise
            for charge in plan_tool_calls(scope.limits, tools):
                items.append((scope.key + charge.counter, charge.amount, charge.cap))
                threshold = None
                if charge.cap is not None and advise is not None:
                    threshold = min(charge.cap * advise, charge.cap)
                meta.append((i, charge, threshold))
                capped = capped or threshold is not None
        return items, meta, capped

    def _time_refusal(self, now: float) -> Advisory:
        for scope in self._chain:
            if scope.restrict_s is not None and now >= scope.restrict_s:
                counters = RunCounters(elapsed_s=now - scope.start_s)
                adv = usage_advisory(scope.limits, counters)
                if adv.level is Level.RESTRICT:
                    return refused(scope.limits, adv)
        return OK  # pragma: no cover - _restrict_at comes from these scopes

    def _read_usage(self) -> list[int] | None:
        if not any(s.limits.has_usage_limits() for s in self._chain):
            return None
        keys = [
            s.key + c for s in self._chain for c in ("input_tokens", "output_tokens", "cost_nusd")
        ]
        try:
            return self._ledger.get(keys)
        except StoreUnavailable:
            reason, name = self._usage_reason()
            self._unavailable(reason, name, self._clock())

    def _usage_counters(self, i: int, shared: list[int] | None, now: float) -> RunCounters:
        scope = self._chain[i]
        tokens_in = tokens_out = nano = 0
        if shared is not None:
            tokens_in, tokens_out, nano = shared[3 * i : 3 * i + 3]
        return RunCounters(
            steps=self._steps if i == 0 else 0,
            no_progress_steps=self._no_progress if i == 0 else 0,
            input_tokens=tokens_in,
            output_tokens=tokens_out,
            cost_usd=nano / NANO,
            elapsed_s=now - scope.start_s,
        )

    def _usage_reason(self) -> tuple[StopReason, str]:
        for scope in self._chain:
            lim = scope.limits
            for name, reason in (
                ("max_cost_usd", StopReason.MAX_COST),
                ("max_input_tokens", StopReason.MAX_INPUT_TOKENS),
                ("max_output_tokens", StopReason.MAX_OUTPUT_TOKENS),
                ("max_total_tokens", StopReason.MAX_TOTAL_TOKENS),
            ):
                if getattr(lim, name) is not None:
                    return reason, name
        return StopReason.MAX_TOTAL_TOKENS, "max_total_tokens"

    def _price(
        self, model: str | None, provider: str | None, tokens_in: int, tokens_out: int
    ) -> float | None:
        if self._pricer.enabled and model is not None:
            return self._pricer.cost(model, provider, tokens_in, tokens_out)
        if not any(s.limits.max_cost_usd is not None for s in self._chain):
            return None  # nothing to enforce: no warning for an unpriced call
        return self._pricer.cost(model, provider, tokens_in, tokens_out)

    def _timeout_for(self, seconds: float | None) -> tuple[float | None, str, float]:
        if seconds is not None and (
            isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0
        ):
            raise ConfigError("seconds", seconds, "a number of seconds > 0, or None")
        now = self._clock()
        with self._lock:
            self._raise_if_stopped()
            limit = seconds if seconds is not None else self.limits.tool_timeout_s
            name = "tool_timeout_s"
            for scope in self._deadlines:
                assert scope.deadline_s is not None
                left = scope.deadline_s - now
                if limit is None or left < limit:
                    limit, name = left, "max_duration_s"
                if left <= 0:
                    stop = check_duration(scope.limits, now - scope.start_s, "tool call")
                    if stop is not None:
                        self._stop_with(stop, now)
        if limit is not None and limit > _MAX_TIMEOUT_S:
            limit = None  # longer than threads can wait: no timeout (documented)
        return limit, name, now

    def _timed_out(self, label: str, limit: float, name: str, started: float) -> NoReturn:
        now = self._clock()
        with self._lock:
            self._raise_if_stopped()
            elapsed = max(now - started, limit)
            if name == "max_duration_s":
                # The run's deadline (this run's or an ancestor's) cut the call short.
                scope = min(self._deadlines, key=lambda s: s.deadline_s or 0.0)
                run_limit = scope.limits.max_duration_s or 0.0
                run_elapsed = max(now - scope.start_s, run_limit)
                stop = check_duration(scope.limits, run_elapsed, f"{label} call")
                assert stop is not None
                self._stop_with(stop, now)
            self._stop_with(
                Stop(
                    reason=StopReason.MAX_DURATION,
                    limit_name=name,
                    limit=limit,
                    observed=elapsed,
                    counter="tool_duration_s",
                    used=elapsed,
                    message=(
                        f"{label} did not finish within {name}={limit:g} s; the call was "
                        "abandoned. Answer from the work done so far, or raise "
                        "Limits(tool_timeout_s=...)"
                    ),
                    tool=label,
                ),
                now,
            )

    def _unavailable_for(
        self, meta: list[tuple[int, Charge, float | None]], now: float
    ) -> NoReturn:
        capped = [charge for _, charge, _ in meta if charge.cap is not None]
        charge = capped[0] if capped else meta[-1][1]
        self._unavailable(charge.reason, charge.limit_name, now)

    def _unavailable(self, reason: StopReason, limit_name: str, now: float) -> NoReturn:
        limit = getattr(self.limits, limit_name, None)
        for scope in self._chain:
            value = getattr(scope.limits, limit_name, None)
            if isinstance(value, (int, float)):
                limit = value
                break
        self._stop_with(
            Stop(
                reason=reason,
                limit_name=limit_name,
                limit=float(limit) if isinstance(limit, (int, float)) else float("nan"),
                observed=float("nan"),
                counter="ledger",
                used=float("nan"),
                message=(
                    f"The shared budget ledger is unreachable and on_unavailable='fail_closed': "
                    f"{limit_name} cannot be checked, so the run stops. Restore the ledger, or "
                    "choose on_unavailable='fail_open'"
                ),
            ),
            now,
        )

    def _stop_with(self, cause: Stop | Assessment, now: float) -> NoReturn:
        """Record why the run stopped (first cause wins) and raise. Call with the lock held."""
        if self._cause is None:
            self._cause = cause
            self._ended_s = now if self._timed else self._clock()  # hot path skips the clock
        raise self._exception(self._cause).with_traceback(None)

    def _raise_if_stopped(self) -> None:
        if self._cause is not None:
            raise self._exception(self._cause).with_traceback(None)

    def _exception(self, cause: Stop | Assessment) -> RunStopped:
        exc = self._exc
        if exc is None:
            exc = self._exc = self._build_exception(cause)
        return exc

    def _build_exception(self, cause: Stop | Assessment) -> RunStopped:
        snap = self._snapshot(self._ended_s if self._ended_s is not None else self._clock())
        partial = self._call_hook(snap)
        return cause.exception(counters=snap.counters, partial=partial)

    def _call_hook(self, snap: GuardSnapshot) -> Any:
        hook = self.partial_answer
        if hook is None:
            return None
        try:
            return hook(snap)
        except Exception:
            # The agent-facing boundary: a failing partial-answer hook must not hide why the
            # run stopped. Count it, log it, and stop without a partial answer.
            self.hook_errors += 1
            logger.exception("the partial_answer hook raised; stopping without a partial answer")
            return None

    def _snapshot(self, now: float) -> GuardSnapshot:
        scope = self._chain[0]
        tools = sorted(self._tools_seen)
        keys = [
            scope.key + c
            for c in ("tool_calls", "input_tokens", "output_tokens", "cost_nusd", "subagents")
        ]
        keys += [scope.key + "tool:" + t for t in tools]
        try:
            values = self._ledger.get(keys)
        except StoreUnavailable:
            values = [0] * len(keys)
        by_tool = {t: v for t, v in zip(tools, values[5:], strict=True) if v}
        end = self._ended_s if self._ended_s is not None else now
        counters = RunCounters(
            steps=self._steps,
            tool_calls=values[0],
            tool_calls_by_tool=by_tool,
            max_duplicates=max(self._dups.values(), default=0),
            input_tokens=values[1],
            output_tokens=values[2],
            cost_usd=values[3] / NANO,
            unpriced_calls=self._unpriced,
            elapsed_s=max(end - scope.start_s, 0.0),
            no_progress_steps=self._no_progress,
            subagents=values[4],
        )
        cause = self._cause
        state = self._state
        verdict = Verdict.WORKING
        if self._loops and state.current is not None:
            verdict = state.current.verdict
        if isinstance(cause, Assessment):
            verdict = cause.verdict
        return GuardSnapshot(
            run_id=self.run_id,
            counters=counters,
            reason=self.reason,
            stop=cause if isinstance(cause, Stop) else None,
            loop=cause if isinstance(cause, Assessment) else None,
            verdict=verdict,
            policy_version=self.loop_policy.version if self.loop_policy is not None else None,
            normalizer_version=self.normalizer.version,
            limits=self.limits,
            nudge=self._nudge,
            after_stop_model_calls=self._after_model,
            after_stop_tool_calls=self._after_tools,
        )
