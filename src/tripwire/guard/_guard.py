"""The :class:`Guard`: one run's budgets and loop refusals, called from inside the agent loop."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, NoReturn, TypeVar

from tripwire.core import receipt as rc
from tripwire.core.budget import (
    NANO,
    NO_LIMITS,
    OK,
    Advisory,
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
from tripwire.guard._decide import (
    SOFT_STOPS,
    last_step_stop,
    nudge_advisory,
    timeout_stop,
    unavailable_stop,
    wrap_up_advisory,
)
from tripwire.guard._ledger import MAX_TOOL_NAME, LedgerView, ScopeKeys, ToolPlan, Usage, tool_key
from tripwire.guard._values import INHERIT, GuardSnapshot, Inherit, OnLoop
from tripwire.prices import PriceFn, Pricer, genai_price, usable_cost
from tripwire.store.base import Ledger, OutageShareSpent, StoreUnavailable
from tripwire.store.memory import MemoryLedger

__all__ = ["Guard"]

logger = logging.getLogger("tripwire.guard")

_T = TypeVar("_T")
_PENDING_MAX: Final = 1024
"""Signatures computed before a call, kept for its ``after_tool`` (bounded: cleared when full)."""
_PLANS_MAX: Final = 256
"""Ledger plans cached per tool (bounded: cleared when full)."""
_TOOLS_SHOWN_MAX: Final = 256
"""Distinct tools a run's snapshot lists per tool (all are counted in the total)."""

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

_MAX_COUNT: Final = 1 << 62
"""Token counts at or above this are refused (``ConfigError``): ledgers count in 64 bits."""
_MAX_COST_USD: Final = 1e9
"""Reported costs at or above this (USD) are refused (``ConfigError``)."""
_MAX_TIMEOUT_S: Final = 86_400.0 * 365
"""Timeouts longer than a year are treated as no timeout (threads cannot wait that long)."""

_DEFAULT_PRICER: Final = Pricer(genai_price)
"""One pricer for every guard on the default price table: it warns once per model per process."""

_END_KINDS: Final = {
    StopReason.COMPLETED: rc.EndKind.NATURAL_FINISH,
    StopReason.USER_CANCELLED: rc.EndKind.USER_ABORT,
    StopReason.MAX_DURATION: rc.EndKind.TIMEOUT,
    StopReason.TOOL_ERROR: rc.EndKind.TOOL_FAILURE,
    StopReason.APPROVAL_REQUIRED: rc.EndKind.APPROVAL_REQUESTED,
}
"""How a run ended, by stop reason; every other reason is a ``stop_condition``."""

_USAGE_LIMITS: Final = (
    ("max_cost_usd", StopReason.MAX_COST, "cost_usd"),
    ("max_input_tokens", StopReason.MAX_INPUT_TOKENS, "input_tokens"),
    ("max_output_tokens", StopReason.MAX_OUTPUT_TOKENS, "output_tokens"),
    ("max_total_tokens", StopReason.MAX_TOTAL_TOKENS, "total_tokens"),
)

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


def _shown(value: Any) -> Any:
    """``value`` for an error message: an integer too long to print is described instead."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"<an integer of {value.bit_length()} bits>"
    return value


@dataclass(frozen=True, slots=True)
class _Scope:
    """One run of the chain a guard spends from: itself, its parent, ... up to the root."""

    keys: ScopeKeys
    """Its ledger counters."""
    limits: Limits
    start_s: float
    """When it started (the guard's monotonic clock)."""
    deadline_s: float | None
    restrict_s: float | None
    """When the duration budget reaches its restrict level."""


class Guard:
    """Enforces one run's budgets and stops loops; shares budgets with its sub-agents.

    Args:
        limits: the run's :class:`~tripwire.core.budget.Limits` (default: none, only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off (an
            identical retry of a call that failed with ``retryable=False`` is still refused).
        normalizer: the signature normalizer (tool + arguments → signature).
        clock: monotonic seconds, for durations and deadlines (injectable for tests);
            receipts record wall-clock times.
        ledger: where shared counters live: a :class:`~tripwire.store.memory.MemoryLedger`
            (default, one per root guard) or a :class:`~tripwire.store.redis.RedisLedger` to
            share one budget across processes (give every process the same ``run_id``).
        prices: ``(model, provider, input_tokens, output_tokens) -> USD | None``; default the
            ``genai-prices`` table; ``None`` prices nothing (report ``cost_usd`` yourself).
            Priced through :class:`tripwire.prices.Pricer` (warns once per model).
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
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ConfigError("run_id", run_id, "a non-empty str, or None")
        if not callable(clock):
            raise ConfigError("clock", clock, "a callable returning seconds, like time.monotonic")
        if ledger is not None and not all(callable(getattr(ledger, m, None)) for m in ("reserve", "add", "get")):
            raise ConfigError("ledger", ledger, "a Ledger (MemoryLedger, SqliteLedger, RedisLedger), or None")
        if not isinstance(normalizer, Normalizer):
            raise ConfigError("normalizer", normalizer, "a tripwire Normalizer")
        self.limits = limits
        self.loop_policy = loop_policy
        self.on_loop: OnLoop = "nudge" if on_loop == "nudge" else "stop"
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
            self._view = LedgerView(ledger if ledger is not None else MemoryLedger())
            keys = ScopeKeys.root(self.run_id)
            parents: tuple[_Scope, ...] = ()
            self._tools_seen: set[str] = set()
            self._pricer = _DEFAULT_PRICER if prices is genai_price else Pricer(prices)
        else:
            self._view = _parent._view
            keys = _parent._chain[0].keys.child(_parent._children)
            parents = _parent._chain
            self._tools_seen = _parent._tools_seen
            self._pricer = _parent._pricer
        view = self._view
        self._reserve_items = view.reserve if view.remote else view.ledger.reserve
        """The ledger's reserve (through the view only when the view keeps its totals)."""
        self._chain: tuple[_Scope, ...] = (_Scope(keys, limits, start, deadline, restrict_at), *parents)
        self._restrict_at = min(
            (s.restrict_s for s in self._chain if s.restrict_s is not None), default=float("inf")
        )
        self._deadlines = tuple(s for s in self._chain if s.deadline_s is not None)
        self._timed = bool(self._deadlines)
        self._usage_limited = any(s.limits.has_usage_limits() for s in self._chain)
        self._cost_limited = any(s.limits.max_cost_usd is not None for s in self._chain)
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
        self._plans: dict[str, ToolPlan] = {}
        """Ledger plans by (clipped) tool name."""
        self._last_progress: str | None = None
        self._no_progress = 0
        self._unpriced = 0
        self._restricted: Advisory | None = None
        """The refusal returned for tool calls while the run is restricted."""
        self._nudge: Assessment | None = None
        self._nudge_due: Advisory | None = None
        """A nudge decided in ``after_tool``, handed out by the next ``before_tool(s)``."""
        self._last_step: tuple[Advisory, Limits] | None = None
        """Set while the step that ``before_step`` restricted runs: the run's last step."""
        self._final: Stop | None = None
        """The limit the run ends on after its last step (the stop reason; raised next step)."""
        self._after_model = 0
        self._after_tools = 0
        self._step_after_stop = False
        """A ``before_step`` after the stop was counted; its usage report is the same call."""
        self._refused_after_stop = 0
        """Tool calls refused after the stop whose ``after_tool`` may still come."""
        self._cause: Stop | Assessment | None = None
        self._origin: dict[str, str | float | None] | None = None
        """Who stopped the run from outside (:meth:`stop`): source, by, at."""
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
                if last is None and isinstance(cause, Stop) and cause.reason in SOFT_STOPS:
                    # A tool-call cap refuses tools, not the final answer: one tool-less step.
                    wrap = wrap_up_advisory(cause, self.limits)
                    self._last_step = (wrap, self.limits)
                    self._steps += 1
                    return wrap
                self._after_model += 1
                self._step_after_stop = True
                self._raise_if_stopped()
            usage = self._read_usage(now)
            worst, worst_limits = OK, self.limits
            stop: Stop | None = None
            for i, scope in enumerate(self._chain):
                counters = self._usage_counters(i, usage, now)
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
                self._stop_with(
                    self._final or stop or last_step_stop(*last, self._steps), now
                )
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

    def before_tool(self, tool: str, arguments: Any = ABSENT, *, refusable: bool = True) -> Advisory:
        """Call before running one tool call; see :meth:`before_tools` (the hot path).

        ``refusable=False``: the caller cannot keep the call from running (a framework's
        callback can raise, but not hand a refusal to the model in place of the result). A
        soft refusal (the nudge, a restriction near a budget's end) is then still returned,
        to say what was not delivered, but the call is counted as one that runs, caps and
        all; stops raise as always.
        """
        if not isinstance(tool, str):
            raise ConfigError("tool", tool, "a tool name (str)")
        now = self._clock() if self._timed else 0.0
        soft: Advisory | None = None
        with self._lock:
            if self._cause is not None:
                self._refuse_after_stop(1)
            if self._timed:
                self._check_time(now)
            if self._restricted is not None:
                if refusable:
                    return self._restricted
                soft = self._restricted
            elif self._nudge_due is not None:
                if refusable:
                    return self._hand_out_nudge()
                soft = self._hand_out_nudge()
            sig: Signature | None = None
            if self._loops or self._dup_cap is not None or self._state.failures:
                sig = self.normalizer.signature(tool, arguments)
                if self._loops or self._state.failures:
                    nudge = self._preview((sig,), now)
                    if nudge is not None:
                        if refusable:
                            return nudge
                        soft = soft if soft is not None else nudge
                if self._dup_cap is not None and self._dups.get(sig.key, 0) >= self._dup_cap:
                    stop = check_duplicates(self.limits, self._dups, ((tool, sig.key),))
                    assert stop is not None
                    self._stop_with(stop, now)
            name = tool if len(tool) <= MAX_TOOL_NAME else tool_key(tool)
            plan = self._plans.get(name)
            if plan is None:
                if len(self._plans) >= _PLANS_MAX:
                    self._plans.clear()
                plan = self._plans[name] = self._plan((name,))
            totals = self._reserve(plan, now)
            self._inflight += 1
            if name not in self._tools_seen and len(self._tools_seen) < _TOOLS_SHOWN_MAX:
                self._tools_seen.add(name)
            if sig is not None:
                self._dups[sig.key] = self._dups.get(sig.key, 0) + 1
                pending = self._pending
                if len(pending) >= _PENDING_MAX:
                    pending.clear()
                pending[(tool, id(arguments))] = (arguments, sig)
            if soft is not None:
                return soft
            if not plan.capped:
                return OK
            return self._count_advisory(plan, totals)

    def before_tools(self, calls: Iterable[tuple[str, Any]]) -> Advisory:
        """Call before running a batch of tool calls (a parallel batch as a whole).

        Either the whole batch is allowed (and counted), or none of it: a batch that would
        take any cap over its limit is refused before any of it runs. Each call is judged by
        the loop watcher against the run so far.

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
        for call in batch:
            if not isinstance(call, tuple) or len(call) != 2 or not isinstance(call[0], str):
                raise ConfigError("calls", call, "(tool name, arguments) pairs")
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
            names = [tool_key(tool) for tool, _ in batch]
            plan = self._plan(names)
            totals = self._reserve(plan, now)
            self._inflight += len(batch)
            seen = self._tools_seen
            for name in names:
                if name not in seen and len(seen) < _TOOLS_SHOWN_MAX:
                    seen.add(name)
            if sigs is not None:
                dups, pending = self._dups, self._pending
                if len(pending) >= _PENDING_MAX:
                    pending.clear()
                for sig, (tool, args) in zip(sigs, batch, strict=True):
                    dups[sig.key] = dups.get(sig.key, 0) + 1
                    pending[(tool, id(args))] = (args, sig)
            if not plan.capped:
                return OK
            return self._count_advisory(plan, totals)

    def _count_advisory(self, plan: ToolPlan, totals: Sequence[int]) -> Advisory:
        """The most severe count-cap advisory after a reservation brought its counters to
        ``totals`` (in the plan's order)."""
        worst = OK
        for planned, total in zip(plan.charges, totals, strict=True):
            if planned.advise_at is not None and total >= planned.advise_at:
                adv = count_advisory(self._chain[planned.scope].limits, planned.charge, total)
                if adv is not None:
                    worst = worst.worse(adv)
        return worst

    def _preview(self, sigs: Sequence[Signature], now: float) -> Advisory | None:
        """Ask the watcher whether a call would make the run ``stuck``: stop, or nudge."""
        state, policy, loops = self._state, self._watch_policy, self._loops
        for sig in sigs:
            found = preview(state, sig.tool, sig, policy, self.normalizer)
            if found is None or (not loops and found.rule is not Rule.RETRY_OF_NON_RETRYABLE):
                continue
            if self.on_loop == "nudge" and self._nudge is None:
                self._nudge = found
                return nudge_advisory(found)
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
        exc = self._exc
        if exc is None:
            assert self._cause is not None
            exc = self._exception(self._cause)
        raise exc.with_traceback(None)

    def _check_time(self, now: float) -> None:
        for scope in self._deadlines:
            stop = check_duration(scope.limits, now - scope.start_s, "tool call")
            if stop is not None:
                self._stop_with(stop, now)
        if now >= self._restrict_at and self._restricted is None:
            refusal = self._time_refusal(now)
            if not refusal.allowed:
                self._restricted = refusal

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
                after the nudge: at any call where a loop rule trips and nothing explains it).
            RunStopped: a tool body ran after the run was stopped (counted in
                :attr:`after_stop`); a call allowed before the stop that finishes after it
                returns ``None``.
        """
        if not isinstance(tool, str):
            raise ConfigError("tool", tool, "a tool name (str)")
        if result is not None and not isinstance(result, ToolResult):
            raise ConfigError("result", result, "a ToolResult or None")
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
                if (
                    result.value is not None
                    and self._loops
                    and (self._digest_all or tool in policy.polling_tools)
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
                # After the nudge, a trip that nothing explains away stops the run, even when
                # the verdict did not change.
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
                    self._nudge_due = nudge_advisory(assessment)
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
            ConfigError: a token count is not an integer ``>= 0`` (below 2**62),
                ``cost_usd`` is not a finite number ``>= 0`` (below 1e9), or ``model`` or
                ``provider`` is neither a str nor ``None``.
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
        for name, text in (("model", model), ("provider", provider)):
            if text is not None and not isinstance(text, str):
                raise ConfigError(name, _shown(text), "the name as a str, or None")
        cost: float | None
        if cost_usd is not None:
            cost = usable_cost(cost_usd)
            if cost is None or cost >= _MAX_COST_USD:
                raise ConfigError(
                    "cost_usd", _shown(cost_usd), "a finite number >= 0 and below 1e9, or None"
                )
        elif (model is None or not self._pricer.enabled) and not self._cost_limited:
            cost = None  # nothing to enforce: an unpriced call needs no warning
        else:
            # Called from here so that the warning points at the caller of record_usage.
            cost = self._pricer.cost(model, provider, input_tokens, output_tokens)
        nano = round(cost * NANO) if cost is not None else 0
        now = self._clock()
        with self._lock:
            last = self._last_step
            if self._cause is not None and last is None:
                if self._step_after_stop:
                    self._step_after_stop = False  # the before_step of this call counted it
                else:
                    self._after_model += 1
                self._raise_if_stopped()
            if cost is None:
                self._unpriced += 1
            items: list[tuple[str, int]] = []
            for scope in self._chain:
                keys = scope.keys
                items += (
                    (keys.input_tokens, input_tokens),
                    (keys.output_tokens, output_tokens),
                    (keys.cost_nusd, nano),
                )
            try:
                totals = self._view.add(items)
            except StoreUnavailable:
                self._view.count_locally(items)
                if last is not None:
                    return last[0]
                if self._usage_limited:
                    self._unavailable_usage(now)
                return OK
            worst, worst_limits = OK, self.limits
            for scope in self._chain:
                used = Usage.read(scope.keys, totals)
                counters = RunCounters(
                    input_tokens=used.input_tokens,
                    output_tokens=used.output_tokens,
                    cost_usd=used.cost_nusd / NANO,
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
                    self._final = last_step_stop(*last, self._steps)
                return last[0]
            if worst.level is Level.RESTRICT:
                self._restricted = refused(worst_limits, worst)
            return worst

    # -- sub-agents -------------------------------------------------------------------------

    def subagent(
        self, limits: Limits = NO_LIMITS, *, loop_policy: LoopPolicy | Inherit | None = INHERIT
    ) -> Guard:
        """Start a sub-agent: a child guard that spends from this run's budget.

        The child has its own ``limits`` (for it alone, e.g. tighter) and also consumes
        from every ancestor's shared counters (tool calls, per-tool counts, tokens, cost,
        sub-agents) and deadline, through the same ledger. Steps, duplicates and the
        no-progress streak are per run. ``loop_policy`` defaults to this run's
        (:data:`~tripwire.guard.INHERIT`); ``None`` switches the child's loop detection off.

        Raises:
            BudgetExceeded: ``max_subagents`` (of this run or an ancestor) would be exceeded.
        """
        if loop_policy is not None and not isinstance(loop_policy, (LoopPolicy, Inherit)):
            raise ConfigError("loop_policy", loop_policy, "a LoopPolicy, None or INHERIT")
        now = self._clock()
        with self._lock:
            self._raise_if_stopped()
            charges = [plan_subagent(s.limits) for s in self._chain]
            keys = [s.keys.subagents for s in self._chain]
            items = [(k, 1, c.cap) for k, c in zip(keys, charges, strict=True)]
            try:
                reservation = self._view.reserve(items)
            except StoreUnavailable as exc:
                self._unavailable_reserve(items, charges, now, share_spent=isinstance(exc, OutageShareSpent))
            else:
                if reservation.refused is not None:
                    i = reservation.refused
                    self._stop_with(charge_stop(charges[i], reservation.totals[i]), now)
            self._children += 1
            policy = self.loop_policy if isinstance(loop_policy, Inherit) else loop_policy
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
            ConfigError: ``seconds`` is not a number ``> 0`` (checked before ``fn`` runs).
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
        import asyncio  # here, not at the top: ``import tripwire`` need not load asyncio

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
        if self._view.remote:
            import asyncio  # see atimeout

            return await asyncio.to_thread(fn)
        return fn()

    # -- end of run -------------------------------------------------------------------------

    def finish(self, reason: StopReason = StopReason.COMPLETED) -> None:
        """Record how the run ended when the guard did not stop it (completed, cancelled…).

        After a last step (``before_step`` returned ``restrict``) the stop reason stays the
        limit that step was told about.
        """
        if not isinstance(reason, StopReason):
            raise ConfigError("reason", reason, "a StopReason")
        with self._lock:
            if self._cause is None and self._finished is None:
                self._finished = reason
                self._ended_s = self._clock()
                if self._last_step is not None and self._final is None:
                    self._final = last_step_stop(*self._last_step, self._steps)

    def stop(
        self,
        cause: Stop | Assessment,
        *,
        source: str,
        by: str | None = None,
        at: float | None = None,
        via: str | None = None,
    ) -> RunStopped:
        """Stop the run from outside the guard: an operator's kill, the fleet service's verdict.

        The run ends as if the guard had stopped it itself: :attr:`stopped` holds the
        exception, every later :meth:`before_step` and :meth:`before_tool` raises it again
        (counted in :attr:`after_stop`), and the receipt's ``condition`` names ``source``,
        ``by``, ``via`` (when given) and ``at`` besides the cause's own inputs (the
        service's receipt of an operator's kill says the same). The first cause wins: a run already
        stopped keeps its cause (and a run already finished its end).

        Args:
            cause: a ``stuck`` loop :class:`~tripwire.core.watch.Assessment` (the fleet judged
                the run stuck) or a :class:`~tripwire.core.budget.Stop` (an operator's kill is
                one with reason ``user_cancelled``; a budget the fleet enforces).
            source: what raised it, e.g. ``"fleet"`` or ``"operator"``.
            by: who acted (a dashboard user, an API token's name, a service).
            at: when (Unix seconds, as the service recorded it).
            via: through what (``dashboard`` or ``api`` for an operator's kill), if known.

        Returns:
            The exception that stops the run (raise it): this cause's, or the earlier one's.
        """
        if not isinstance(cause, (Stop, Assessment)):
            raise ConfigError("cause", cause, "a Stop or a loop Assessment")
        if not isinstance(source, str) or not source:
            raise ConfigError("source", source, "a non-empty str")
        if by is not None and not isinstance(by, str):
            raise ConfigError("by", by, "a str or None")
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float))):
            raise ConfigError("at", at, "Unix seconds or None")
        if via is not None and not isinstance(via, str):
            raise ConfigError("via", via, "a str or None")
        with self._lock:
            if self._cause is None and self._finished is None:
                self._cause = cause
                origin: dict[str, str | float | None] = {"source": source, "by": by}
                if via is not None:
                    origin["via"] = via
                origin["at"] = at
                self._origin = origin
                self._ended_s = self._clock()
                self._last_step = None
            if self._cause is None:  # the run had ended: nothing to record
                return cause.exception(counters=self._snapshot(self._clock()).counters)
            return self._exception(self._cause)

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
        end: rc.EndKind | None = None,
        reason: StopReason | None = None,
        crashed: bool = False,
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
                answers, or its receipt explains as ``uncertain`` (the guard warns once).
            crashed: the run ended with an exception that is not a tripwire stop (the model
                client raised, say): with no stop reason recorded, the receipt explains as
                ``uncertain``, and the guard does not warn (nothing was forgotten).
            **fields: further ``StopReceipt`` fields (``outcomes``, ``requires_outcome``…).
        """
        if reason is not None and not isinstance(reason, StopReason):
            raise ConfigError("reason", reason, "a StopReason or None")
        with self._lock:
            snap = self._snapshot(self._clock())
            after = self.after_stop
        if reason is None:
            reason = snap.reason
        if reason is None and not crashed:
            _warn_unfinished()
        if end is None and reason is not None:
            end = _END_KINDS.get(reason, rc.EndKind.STOP_CONDITION)
        c = snap.counters
        counters = rc.Counters(
            steps=c.steps,
            tool_calls=c.tool_calls,
            input_tokens=c.input_tokens,
            output_tokens=c.output_tokens,
            cost_usd=None if c.unpriced_calls and not c.cost_usd else c.cost_usd,
            duration_s=c.elapsed_s,
        )
        fields.setdefault("after_stop", after)
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
            **fields,
        )

    # -- internals --------------------------------------------------------------------------

    def _plan(self, tools: Sequence[str]) -> ToolPlan:
        return ToolPlan.build(((s.keys, s.limits) for s in self._chain), tools)

    def _time_refusal(self, now: float) -> Advisory:
        for scope in self._chain:
            if scope.restrict_s is not None and now >= scope.restrict_s:
                counters = RunCounters(elapsed_s=now - scope.start_s)
                adv = usage_advisory(scope.limits, counters)
                if adv.level is Level.RESTRICT:
                    return refused(scope.limits, adv)
        return OK  # pragma: no cover - _restrict_at comes from these scopes

    def _read_usage(self, now: float) -> list[Usage] | None:
        """Each scope's tokens and cost from the ledger (``None`` without usage limits)."""
        if not self._usage_limited:
            return None
        keys = [k for s in self._chain for k in s.keys.usage()]
        try:
            totals = self._view.get(keys)
        except StoreUnavailable:
            self._unavailable_usage(now)
        return [Usage.read(s.keys, totals) for s in self._chain]

    def _usage_counters(self, i: int, usage: list[Usage] | None, now: float) -> RunCounters:
        scope = self._chain[i]
        used = usage[i] if usage is not None else Usage()
        return RunCounters(
            steps=self._steps if i == 0 else 0,
            no_progress_steps=self._no_progress if i == 0 else 0,
            input_tokens=used.input_tokens,
            output_tokens=used.output_tokens,
            cost_usd=used.cost_nusd / NANO,
            elapsed_s=now - scope.start_s,
        )

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
            self._stop_with(timeout_stop(label, name, limit, elapsed), now)

    def _reserve(self, plan: ToolPlan, now: float) -> tuple[int, ...]:
        """Reserve ``plan`` in the ledger, or stop the run at the cap it would exceed."""
        try:
            reservation = self._reserve_items(plan.items)
        except StoreUnavailable as exc:
            return self._unavailable_reserve(
                plan.items, [p.charge for p in plan.charges], now, share_spent=isinstance(exc, OutageShareSpent)
            )
        refused_at = reservation.refused
        if refused_at is not None:
            charge = plan.charges[refused_at].charge
            self._stop_with(charge_stop(charge, reservation.totals[refused_at]), now)
        return reservation.totals

    def _unavailable_reserve(
        self,
        items: Sequence[tuple[str, int, int | None]],
        charges: Sequence[Any],
        now: float,
        *,
        share_spent: bool = False,
    ) -> tuple[int, ...]:
        """The ledger is unreachable (``fail_closed``, or ``fail_open`` with this process's
        outage share spent): stop when a cap is at stake, else count locally and go on
        (nothing is enforced that could be exceeded)."""
        for (key, _, cap), charge in zip(items, charges, strict=True):
            if cap is not None:
                used = self._view.last([key])[key]
                counter = charge.counter.removeprefix("tool:")
                if charge.tool:
                    counter += " calls"
                self._stop_with(
                    unavailable_stop(
                        charge.reason, charge.limit_name, cap, counter, used, share_spent=share_spent
                    ),
                    now,
                )
        self._view.count_locally([(k, amount) for k, amount, _ in items])
        last = self._view.last([k for k, _, _ in items])
        return tuple(last[k] for k, _, _ in items)

    def _unavailable_usage(self, now: float) -> NoReturn:
        """The ledger is unreachable (``fail_closed``) while tokens or cost must be checked."""
        for scope in self._chain:
            lim = scope.limits
            for name, reason, counter in _USAGE_LIMITS:
                limit = getattr(lim, name)
                if limit is None:
                    continue
                used = Usage.read(scope.keys, self._view.last(scope.keys.usage()))
                value: float = {
                    "cost_usd": used.cost_nusd / NANO,
                    "input_tokens": used.input_tokens,
                    "output_tokens": used.output_tokens,
                    "total_tokens": used.input_tokens + used.output_tokens,
                }[counter]
                self._stop_with(unavailable_stop(reason, name, limit, counter, value), now)
        raise AssertionError("called without a usage limit")  # pragma: no cover

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
        keys = self._chain[0].keys
        tools = sorted(self._tools_seen)
        names = [keys.tool_calls, *keys.usage(), keys.subagents]
        names += [keys.tool(t) for t in tools]
        try:
            totals = self._view.get(names)
        except StoreUnavailable:
            totals = self._view.last(names)  # the last totals the ledger reported
        used = Usage.read(keys, totals)
        by_tool = {t: n for t in tools if (n := totals[keys.tool(t)])}
        end = self._ended_s if self._ended_s is not None else now
        counters = RunCounters(
            steps=self._steps,
            tool_calls=totals[keys.tool_calls],
            tool_calls_by_tool=by_tool,
            max_duplicates=max(self._dups.values(), default=0),
            input_tokens=used.input_tokens,
            output_tokens=used.output_tokens,
            cost_usd=used.cost_nusd / NANO,
            unpriced_calls=self._unpriced,
            elapsed_s=max(end - self._chain[0].start_s, 0.0),
            no_progress_steps=self._no_progress,
            subagents=totals[keys.subagents],
        )
        cause = self._cause
        verdict = Verdict.WORKING
        current = self._state.current
        if self._loops and current is not None:
            verdict = current.verdict
        if isinstance(cause, Assessment):
            verdict = cause.verdict
        stop = cause if isinstance(cause, Stop) else None
        final = self._final
        if cause is None and final is not None:
            # A graceful last step: the limit the run ended on, no step refused.
            stop = replace(final, observed=final.used)
        return GuardSnapshot(
            run_id=self.run_id,
            counters=counters,
            reason=self.reason,
            stop=stop,
            loop=cause if isinstance(cause, Assessment) else None,
            verdict=verdict,
            policy_version=self.loop_policy.version if self.loop_policy is not None else None,
            normalizer_version=self.normalizer.version,
            limits=self.limits,
            nudge=self._nudge,
            after_stop_model_calls=self._after_model,
            after_stop_tool_calls=self._after_tools,
            origin=self._origin,
        )
