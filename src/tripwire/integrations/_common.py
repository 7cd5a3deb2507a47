"""The logic every framework adapter shares: one run under one :class:`~tripwire.guard.Guard`.

An adapter translates its framework's extension points into five calls on a
:class:`RunControl`, and ends the run through the framework's own way of ending one::

    run = new_run(Limits(max_steps=20), on_loop="nudge", agent="support", on_receipt=store.save)
    try:
        while True:
            run.before_model()                      # may raise RunStopped
            tools_for_this_step = None if run.wrap_up() else tools
            reply = model(messages, tools=tools_for_this_step)
            run.after_model(model=reply.model, input_tokens=..., output_tokens=...)
            if not reply.tool_calls:
                run.finish(reply.text)              # the receipt goes to on_receipt
                return reply.text
            for call in reply.tool_calls:
                refusal = run.before_tool(call.name, call.args)   # may raise RunStopped
                if refusal is not None:             # not run: hand the text to the model
                    messages.append(tool_message(call, refusal)); continue
                result = run_tool(call)
                run.after_tool(call.name, call.args, result)      # may raise RunStopped
    except RunStopped as exc:
        return run.stop_result(exc)                 # a StoppedRun, not a traceback

Why a layer over the Guard: frameworks swallow exceptions in places (a tool error becomes a
message to the model; a callback's exception is logged and dropped), so the guard's verdict
must survive until the adapter can act on it through the framework's own way of ending a run.
:attr:`RunControl.stopped` keeps it; every later :meth:`RunControl.before_model` and
:meth:`RunControl.before_tool` raises it again, so no model call and no tool body runs after a
stop, whichever hook the framework lets through.

Thread-safety: a :class:`RunControl` is one run; the guard under it has its own lock and this
layer's own state (the receipt, the wrap-up text) has another. Two runs in one process are two
controls. :data:`current_run` holds the run of the current thread or asyncio task, for callbacks
that only get framework objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from tripwire import remote as _remote
from tripwire.core.budget import NO_LIMITS, Advisory, Level, Limits, RunCounters, Stop
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.reasons import StopReason
from tripwire.core.receipt import StopReceipt
from tripwire.core.results import ToolResult
from tripwire.errors import BudgetExceeded, ConfigError, RunStopped
from tripwire.guard import Guard, GuardSnapshot

try:  # the otel extra: the run's trace id, and the in-process kill flags
    from opentelemetry.trace import get_current_span as _current_span

    from tripwire.otel.killswitch import KILL_FLAGS as _KILL_FLAGS
    from tripwire.otel.killswitch import active_run as _active_run
except ImportError:  # pragma: no cover - without it, no run has a trace id to be flagged by
    _current_span = None  # type: ignore[assignment]

__all__ = [
    "CallTurns",
    "OnLoop",
    "RunControl",
    "RunSettings",
    "StoppedRun",
    "current_run",
    "new_run",
]

logger = logging.getLogger("tripwire.integrations")

ReceiptSink = Callable[[StopReceipt], None]
"""Where a finished run's receipt goes (e.g. a store's ``save``); called once per run."""
PartialAnswer = Callable[[GuardSnapshot], Any]
"""Builds a partial answer from the run state when tripwire stops the run."""

_MAX_RESULT_TEXT: Final = 64 * 1024
"""Longest result text handed to the guard for digesting (longer results are cut first)."""


class OnLoop(str, Enum):
    """What happens when the loop watcher says the run is stuck."""

    STOP = "stop"
    """The kill switch (default): the run stops at the call that would be stuck."""
    NUDGE = "nudge"
    """One message to the model first, naming what it repeated; the kill switch at the next
    repeated call. A model that changes approach carries on untouched."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StoppedRun:
    """What the caller gets when tripwire ended the run: a structured result, not a traceback."""

    reason: StopReason
    """Which condition fired (``loop_detected``, ``max_steps``, ``max_cost``…)."""
    message: str
    """The stop's message: what happened and what to do; names the tool and a digest
    prefix, never raw arguments."""
    counters: RunCounters
    """What the run consumed up to the stop (steps, tool calls, tokens, cost, time)."""
    receipt: StopReceipt
    """The run's stop receipt (also handed to ``on_receipt``)."""
    partial: Any
    """The partial-answer hook's result, or the graceful last step's answer, or ``None``."""
    error: RunStopped
    """The exception that stopped the run, for callers that want to re-raise it."""


current_run: ContextVar[RunControl | None] = ContextVar("tripwire_current_run", default=None)
"""The run of this thread or asyncio task (set by :meth:`RunControl.activate`), for framework
callbacks that get only framework objects."""


def _tokens(value: Any) -> int:
    """A token count from a framework's usage object: ``None``, floats and junk become ints."""
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and math.isfinite(value):
        return max(int(value), 0)
    return 0


def _cost(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _result_value(result: Any) -> Any:
    """What the guard digests of a tool result: plain values as they are, anything else as text."""
    if result is None or isinstance(result, (str, int, float, bool, dict, list, tuple)):
        if isinstance(result, str) and len(result) > _MAX_RESULT_TEXT:
            return result[:_MAX_RESULT_TEXT]
        return result
    content = getattr(result, "content", None)  # LangChain ToolMessage and friends
    if isinstance(content, (str, list, dict)):
        return content
    text = str(result)
    return text[:_MAX_RESULT_TEXT]


class RunControl:
    """One run under one :class:`~tripwire.guard.Guard`: what every adapter calls.

    Args:
        guard: the run's guard (its limits, loop policy and nudge mode).
        agent: the agent's name, recorded on the receipt.
        on_receipt: called once with the run's :class:`~tripwire.core.receipt.StopReceipt`
            when the run ends (by itself, :meth:`finish`, or stopped, :meth:`stop_result`).
            It must not block for long; an exception it raises is logged once and ignored.
    """

    guard: Guard
    """The run's guard."""
    agent: str
    """The agent's name on the receipt."""

    def __init__(self, guard: Guard, *, agent: str, on_receipt: ReceiptSink | None = None) -> None:
        if not isinstance(guard, Guard):
            raise ConfigError("guard", guard, "a tripwire Guard")
        if not isinstance(agent, str) or not agent:
            raise ConfigError("agent", agent, "a non-empty agent name")
        if on_receipt is not None and not callable(on_receipt):
            raise ConfigError("on_receipt", on_receipt, "a callable taking a StopReceipt, or None")
        self.guard = guard
        self.agent = agent
        self._on_receipt = on_receipt
        self._lock = threading.Lock()
        self._receipt: StopReceipt | None = None
        self._wrap_up: str | None = None
        self._last_answer: Any = None
        self.receipt_errors = 0
        """How many times ``on_receipt`` raised (logged, then ignored)."""

    # -- model calls ------------------------------------------------------------------------

    def before_model(self) -> Advisory:
        """Call before each model call: counts the step, or refuses it.

        Returns:
            The guard's advisory. At ``restrict`` this is the last step: make the model call
            without tools and with :meth:`wrap_up`'s instruction.

        Raises:
            RunStopped: the run is stopped (a budget fired now, the fleet's flag, or an
                earlier stop).
            ConfigError: the fleet service refused this process's token.
        """
        if self.guard.stopped is None:
            self.obey_fleet()
        advisory = self.guard.before_step()
        wrap = advisory.message if advisory.level is Level.RESTRICT and advisory.message else None
        with self._lock:
            self._wrap_up = wrap
        return advisory

    def wrap_up(self) -> str | None:
        """The wrap-up instruction for a tool-less last step, or ``None`` for a normal step.

        Set by the last :meth:`before_model` when a step, cost, token or time budget is nearly
        spent ("this is the last step: answer now from what you have, without tools.").
        """
        return self._wrap_up

    def after_model(
        self,
        *,
        model: str | None,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float | None = None,
        provider: str | None = None,
    ) -> None:
        """Call after each model call with the usage the framework reported.

        Counts from frameworks are taken as they come: ``None`` or junk counts as 0 rather
        than failing the agent.

        Raises:
            RunStopped: a token or cost limit fired (not on the graceful last step, whose
                answer is kept).
        """
        self.guard.record_usage(
            model=model if isinstance(model, str) and model else None,
            input_tokens=_tokens(input_tokens),
            output_tokens=_tokens(output_tokens),
            cost_usd=_cost(cost_usd),
            provider=provider if isinstance(provider, str) and provider else None,
        )

    # -- tool calls -------------------------------------------------------------------------

    def before_tool(self, tool: str, arguments: Any, *, refusable: bool = True) -> str | None:
        """Call before running one tool call, with the arguments the model gave.

        ``refusable=False``: the call runs whatever is returned (a callback that cannot
        replace a tool's result); it is counted as a call that runs.

        Returns:
            ``None``: run it. A string: do **not** run it; hand the string to the model as
            the tool's result (the nudge, in nudge mode; or the run is restricted, near a
            budget's end).

        Raises:
            RunStopped: the run stops here (the call would be stuck, a cap fired, the
                fleet's flag, or an earlier stop).
            ConfigError: the fleet service refused this process's token.
        """
        if self.guard.stopped is None:
            self.obey_fleet()
        advisory = self.guard.before_tool(tool, arguments, refusable=refusable)
        if not advisory.allowed:
            return advisory.message or "Tool call refused by tripwire."
        return None

    def after_tool(
        self,
        tool: str,
        arguments: Any,
        result: Any = None,
        *,
        error: BaseException | None = None,
    ) -> None:
        """Call after a tool call ran, with its result or the exception it raised.

        Only a digest of the result is kept. Pass the same ``arguments`` object as to
        :meth:`before_tool` where you can (it saves a second signature).

        Raises:
            RunStopped: the loop watcher says the run is stuck.
        """
        if error is not None:
            outcome = ToolResult.error(type(error).__name__, message="")
        elif isinstance(result, ToolResult):
            outcome = result
        else:
            outcome = ToolResult.success(_result_value(result))
        self.guard.after_tool(tool, arguments, outcome)

    # -- the fleet's kill flags --------------------------------------------------------------

    def obey_fleet(self) -> None:
        """Stop the run if its kill flag is up: the fleet service's (an operator's kill, or
        its verdict, through :mod:`tripwire.remote`) or the in-process span processor's.

        Keyed by the run's own OpenTelemetry trace id, read from the current context (else
        the run whose span last started in this thread or task). :meth:`before_model` and
        :meth:`before_tool` call it first. Without the ``otel`` extra, or outside any span,
        it checks nothing. No network: a context read and dict lookups.

        Raises:
            RunStopped: the flag is up; the guard records it as the run's stop (the receipt
                names who raised it), so every later step is refused too.
            ConfigError: the fleet service refused this process's token.
        """
        if _current_span is None:
            return
        ctx = _current_span().get_span_context()
        trace_id = ctx.trace_id if ctx.is_valid else _active_run()
        if trace_id is None:
            return
        channel = _remote.current()
        if channel is not None:
            try:
                payload = channel.lookup(trace_id)
            except BudgetExceeded as exc:  # fail_closed: the channel is down past its grace
                raise self.guard.stop(
                    Stop(
                        reason=exc.reason,
                        limit_name=exc.limit_name,
                        limit=exc.limit,
                        observed=exc.observed,
                        counter="kill_channel_down_s",
                        used=exc.observed,
                        message=str(exc),
                    ),
                    source="kill_channel",
                ) from None
            if payload is not None:
                operator = payload.get("kind") == "operator"
                # An operator's kill names who acted (the token's name) and through what.
                by = payload.get("actor") if operator else None
                by = by if isinstance(by, str) and by else payload.get("by")
                via = payload.get("via") if operator else None
                at = payload.get("at")
                raise self.guard.stop(
                    _remote.cause_for(payload),
                    source="operator" if operator else "fleet",
                    by=by[:200] if isinstance(by, str) else None,
                    via=via[:40] if isinstance(via, str) else None,
                    at=float(at) if isinstance(at, (int, float)) and not isinstance(at, bool) else None,
                ) from None
        flag = _KILL_FLAGS.get(trace_id)
        if flag is not None:
            cause = flag.assessment if flag.assessment is not None else flag.stop
            assert cause is not None
            raise self.guard.stop(cause, source="span_processor") from None

    # -- end of run -------------------------------------------------------------------------

    @property
    def stopped(self) -> RunStopped | None:
        """The exception that stopped the run, or ``None`` while it may go on."""
        return self.guard.stopped

    def note_answer(self, answer: Any) -> None:
        """Remember the model's latest answer text (the graceful last step's partial answer)."""
        with self._lock:
            self._last_answer = answer

    def finish(self, output: Any = None) -> StopReceipt:
        """The run ended by itself: record it and hand the receipt to ``on_receipt`` (once).

        When tripwire had stopped the run and the framework went on anyway (it swallowed the
        stop), the receipt keeps the stop's reason and the guard's count of what ran after it.

        Returns:
            The run's receipt (the same one on every call).
        """
        if output is not None:
            self.note_answer(output)
        if self.guard.stopped is None:
            self.guard.finish(StopReason.COMPLETED)
        return self._emit()

    def stop_result(self, exc: RunStopped) -> StoppedRun:
        """The caller's structured result for a stop; hands the receipt to ``on_receipt`` once.

        Args:
            exc: the :class:`~tripwire.errors.RunStopped` that ended the run (normally
                :attr:`stopped`; an exception raised by another guard is taken as is).
        """
        receipt = self._emit()
        counters = exc.counters if isinstance(exc.counters, RunCounters) else None
        if counters is None:
            counters = self.guard.snapshot().counters
        partial = exc.partial if exc.partial is not None else self._last_answer
        return StoppedRun(
            reason=exc.reason,
            message=str(exc),
            counters=counters,
            receipt=receipt,
            partial=partial,
            error=exc,
        )

    def failed(self, error: BaseException) -> StopReceipt:
        """The run ended with an exception: record it and hand the receipt to ``on_receipt`` (once).

        Call it where the framework's run raised (its error callback, or around its run call),
        then let the exception go on. A ``KeyboardInterrupt`` or an asyncio cancellation is a
        user abort (``user_cancelled``); a stop tripwire had recorded (that the framework turned
        into another exception) keeps its reason; anything else gets a receipt with no stop
        reason, which explains as ``uncertain``: a crashed run is never ``completed``.

        Returns:
            The run's receipt (the same one on every call).
        """
        if isinstance(error, RunStopped):
            return self.stop_result(error).receipt
        if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)):
            self.guard.finish(StopReason.USER_CANCELLED)
            return self.finish()
        stopped = self.guard.stopped
        if stopped is not None:
            return self.stop_result(stopped).receipt
        return self._emit(crashed=True)  # no reason: it does not claim how the run ended

    @property
    def receipt(self) -> StopReceipt | None:
        """The receipt once the run ended (:meth:`finish` or :meth:`stop_result`), else ``None``."""
        return self._receipt

    @contextlib.contextmanager
    def activate(self) -> Iterator[RunControl]:
        """Make this the :data:`current_run` of the current thread or task, for a ``with`` block."""
        token = current_run.set(self)
        try:
            yield self
        finally:
            current_run.reset(token)

    def _emit(self, *, crashed: bool = False) -> StopReceipt:
        with self._lock:
            receipt = self._receipt
            if receipt is not None:
                return receipt
            made: StopReceipt = self.guard.receipt(self.agent, crashed=crashed)
            receipt = self._receipt = made
        sink = self._on_receipt
        if sink is not None:
            try:
                sink(receipt)
            except Exception:
                # The agent-facing boundary: a failing receipt store must not turn a finished
                # (or cleanly stopped) run into a crash. Count it, log it, keep the receipt.
                self.receipt_errors += 1
                logger.exception("on_receipt raised; the receipt of run %s was not stored",
                                 receipt.run_id)  # fmt: skip
        return receipt

    def __repr__(self) -> str:
        state = "stopped" if self.guard.stopped is not None else "running"
        return f"<RunControl {self.agent} run={self.guard.run_id} {state}>"


def new_run(
    limits: Limits = NO_LIMITS,
    *,
    loop_policy: LoopPolicy | None = DEFAULT_POLICY,
    on_loop: OnLoop | str = OnLoop.STOP,
    agent: str = "agent",
    on_receipt: ReceiptSink | None = None,
    partial_answer: PartialAnswer | None = None,
    **guard_options: Any,
) -> RunControl:
    """Start one run: a fresh :class:`~tripwire.guard.Guard` wrapped in a :class:`RunControl`.

    Args:
        limits: the run's budgets (default none: only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (the kill switch) or ``"nudge"`` (one message first).
        agent: the agent's name on the receipt.
        on_receipt: called once with the run's receipt when it ends.
        partial_answer: builds a partial answer from the run state when tripwire stops the
            run; it travels on :attr:`StoppedRun.partial`.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``,
            ``prices``, ``run_id``, ``clock``, ``normalizer``).

    Raises:
        ConfigError: a setting is invalid (names the field).
    """
    try:
        mode = OnLoop(on_loop)
    except ValueError:
        raise ConfigError("on_loop", on_loop, "'stop' or 'nudge'") from None
    if partial_answer is not None and not callable(partial_answer):
        raise ConfigError("partial_answer", partial_answer, "a callable taking a GuardSnapshot")
    if mode is OnLoop.NUDGE:
        guard_options["on_loop"] = mode.value
    try:
        guard = Guard(limits, loop_policy=loop_policy, **guard_options)
    except TypeError as exc:
        name = next((k for k in guard_options if f"'{k}'" in str(exc)), "guard_options")
        raise ConfigError(
            name, guard_options.get(name), "an option this version of Guard accepts"
        ) from None
    guard.partial_answer = partial_answer
    return RunControl(guard, agent=agent, on_receipt=on_receipt)


class RunSettings:
    """An adapter's per-run settings, checked once, at construction: every adapter builds one
    fresh run from them per framework run (:meth:`new_run`). The OpenAI Agents SDK, smolagents
    and Google ADK adapters' ``Tripwire`` take exactly these.

    Args:
        limits: each run's budgets (default none: only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (the kill switch, default) or ``"nudge"`` (one message first).
        agent: the agent's name on receipts (default the framework agent's own name).
        on_receipt: called once with each run's receipt (e.g. a store's ``save``).
        partial_answer: builds a partial answer from the run state when tripwire stops a run.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``,
            ``prices``, ``clock``, ``normalizer``).

    Raises:
        ConfigError: ``agent`` is not a non-empty name, ``run_id`` was given (each run gets its
            own), or a setting :func:`new_run` refuses (named).
    """

    def __init__(
        self,
        limits: Limits = NO_LIMITS,
        *,
        loop_policy: LoopPolicy | None = DEFAULT_POLICY,
        on_loop: OnLoop | str = OnLoop.STOP,
        agent: str | None = None,
        on_receipt: ReceiptSink | None = None,
        partial_answer: PartialAnswer | None = None,
        **guard_options: Any,
    ) -> None:
        if agent is not None and (not isinstance(agent, str) or not agent):
            raise ConfigError("agent", agent, "a non-empty agent name, or None")
        if "run_id" in guard_options:
            raise ConfigError("run_id", guard_options["run_id"], "one run id per run: not here")
        options: dict[str, Any] = dict(
            guard_options,
            limits=limits,
            loop_policy=loop_policy,
            on_loop=on_loop,
            on_receipt=on_receipt,
            partial_answer=partial_answer,
        )
        new_run(**options)  # validate now, loudly, not at the first run
        self._options = options
        self._agent = agent

    def new_run(self, agent: str = "agent", *, max_steps: int | None = None) -> RunControl:
        """A fresh run with these settings; ``agent`` is the name on the receipt unless the
        ``agent`` option set one. ``max_steps``: the framework's own step cap for this run,
        which becomes the run's step budget unless the limits set a smaller one (so the cap
        ends with the graceful last step, its answer kept)."""
        options = self._options
        limits: Limits = options["limits"]
        if max_steps is not None and (limits.max_steps is None or max_steps < limits.max_steps):
            options = dict(options, limits=dataclasses.replace(limits, max_steps=max_steps))
        return new_run(agent=self._agent or agent, **options)


class _Turn:
    __slots__ = ("lock", "waiting")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


class CallTurns:
    """Identical tool calls of one run, in flight: they run one after the other.

    Frameworks that run a batch of tool calls concurrently (pydantic-ai, the OpenAI Agents
    SDK) would otherwise check every call of the batch before any of them ran: the watcher
    would judge a 4th identical call without having seen the 3rd's result, and 4 or 6 bodies
    of a loop would run where 3 is right. A call takes its turn before it is checked and
    gives it back once the watcher has seen its result (or it was refused); different calls
    still run side by side. One per run, on one event loop.
    """

    __slots__ = ("_inflight",)

    def __init__(self) -> None:
        self._inflight: dict[str, _Turn] = {}

    async def take(self, run: RunControl, tool: str, arguments: Any) -> str:
        """Wait for this call's turn; returns the key to :meth:`give_back`."""
        key = _call_key(run, tool, arguments)
        entry = self._inflight.get(key)
        if entry is None:
            entry = self._inflight[key] = _Turn()
        entry.waiting += 1
        try:
            await entry.lock.acquire()
        except BaseException:  # cancelled while waiting: it never had the turn
            self._leave(key, entry)
            raise
        return key

    def give_back(self, key: str) -> None:
        """End the turn taken by :meth:`take` (once per take)."""
        entry = self._inflight.get(key)
        if entry is None or not entry.lock.locked():
            return
        entry.lock.release()
        self._leave(key, entry)

    @contextlib.asynccontextmanager
    async def turn(self, run: RunControl, tool: str, arguments: Any) -> AsyncIterator[None]:
        """The call's turn, for an ``async with`` block around its check, body and result."""
        key = await self.take(run, tool, arguments)
        try:
            yield
        finally:
            self.give_back(key)

    def _leave(self, key: str, entry: _Turn) -> None:
        entry.waiting -= 1
        if entry.waiting == 0:
            self._inflight.pop(key, None)


def _call_key(run: RunControl, tool: str, arguments: Any) -> str:
    """What makes two calls of a batch identical: the guard's own signature of the call, so
    calls that differ only in a volatile key (``request_id``), which the watcher counts as
    one call, take turns too."""
    try:
        sig = run.guard.normalizer.signature(tool, arguments)
    except Exception:  # the guard judges (and reports) this call itself: no turn to take
        return f"{tool}\0{id(arguments)}"
    return f"{tool}\0{sig.key:x}"
