"""The per-run engine: mapped span events in, decisions out, for many runs at once."""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from tripwire.core.budget import Limits, Meter, RunCounters, Stop
from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, KeyMode, LoopPolicy
from tripwire.core.reasons import Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer, Signature
from tripwire.core.watch import Assessment, RunState, evaluate_hashed
from tripwire.engine._values import (
    Boundary,
    BudgetStopped,
    Decision,
    Event,
    ModelSpan,
    RunEnded,
    StillStuck,
    ToolSpan,
    TraceId,
    VerdictChanged,
)
from tripwire.errors import ConfigError

__all__ = [
    "CALL_ID_MEMORY",
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "Engine",
    "EngineStats",
    "PriceFn",
]

DEFAULT_MAX_TRACES: Final = 10_000
"""Active runs kept at most; beyond it the least recently active one is dropped."""

DEFAULT_IDLE_TTL_S: Final = 15 * 60.0
"""A run with no tool (or, with limits, model) call for this long (15 minutes) is dropped."""

CALL_ID_MEMORY: Final = 16
"""Recent call ids remembered per run (as hashes, 8 bytes each, whatever the id's length)."""

PriceFn = Callable[[str | None, str | None, int, int], float | None]
"""``(model, provider, input_tokens, output_tokens) -> USD | None``: the engine's pricing, e.g.
``tripwire.prices.Pricer(warn=False).cost`` (never raises, warns once per model)."""

_NONE: Final[tuple[Decision, ...]] = ()
_pack_hash: Final = struct.Struct("<q").pack
_STUCK: Final = Verdict.STUCK
_WORKING: Final = Verdict.WORKING
_TOOL_ARGS: Final = KeyMode.TOOL_ARGS


@dataclass(slots=True)
class EngineStats:
    """Counters of one engine. Plain ints: diagnostics, not budgets."""

    tool_calls: int = 0
    """Tool calls judged."""
    duplicate_calls: int = 0
    """Tool spans skipped because their call id was already counted (partial/streamed)."""
    attempts: int = 0
    """Tool spans counted as a new attempt of a call id whose earlier span ended in error."""
    model_calls: int = 0
    """Model calls seen."""
    duplicate_model_calls: int = 0
    """Model calls not counted again for budgets: their response id was counted."""
    verdict_changes: int = 0
    """Verdict changes reported."""
    still_stuck: int = 0
    """Repeated calls of a run already ``stuck`` (its stop re-asserted)."""
    budget_stops: int = 0
    """Budget limits reached (run stops and per-tool stops)."""
    unpriced_calls: int = 0
    """Model calls with no known price under ``max_cost_usd``: their cost is not counted."""
    untracked_tools: int = 0
    """Tool calls not counted per tool because a run had too many capped tools."""
    runs_ended: int = 0
    """Runs forgotten because their root ended, or :meth:`Engine.end` was called."""
    evicted_idle: int = 0
    """Runs dropped after the idle TTL."""
    evicted_lru: int = 0
    """Runs dropped because ``max_traces`` was reached."""

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return {name: getattr(self, name) for name in self.__slots__}


class _Run:
    """One run's state: the loop watcher, recent call ids, the budget meter, last activity."""

    __slots__ = ("call_ids", "failed_ids", "last_seen", "meter", "state")

    def __init__(self, now: float) -> None:
        self.state: RunState | None = None
        """The loop watcher (``None`` until the run's first tool call, or after a sub-agent)."""
        self.last_seen = now
        self.call_ids: bytes | None = None
        """The ``hash()`` of the last :data:`CALL_ID_MEMORY` call ids, 8 bytes each, oldest
        first (``bytes``: ``find`` searches in C, and 16 ids hold 128 bytes)."""
        self.failed_ids: dict[int, int] | None = None
        """``hash(call id) -> attempts`` of the ids whose last execution failed (allocated at
        the first failure that has a call id; at most :data:`CALL_ID_MEMORY` entries)."""
        self.meter: Meter | None = None
        """The budget meter (only with limits)."""


def _positive(name: str, value: object, expected: str, *, integer: bool) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0:  # type: ignore[operator]
        raise ConfigError(name, value, expected)


class Engine:
    """Judges many runs at once from their mapped span events: loops, budgets, run ends.

    The engine knows nothing of OpenTelemetry, files or sockets: the span processor, replay and
    the OTLP receiver map spans (:mod:`tripwire.spans`) and hand it the events; it keeps each
    run's state (the loop watcher's :class:`~tripwire.core.watch.RunState` and one budget
    :class:`~tripwire.core.budget.Meter`) and returns what changed as values. Acting on a
    decision (a kill flag, an alert, a span annotation, a stored record) is the caller's job.

    Memory is bounded: at most ``max_traces`` runs (least recently active dropped first), each
    dropped after ``idle_ttl_s`` without activity and when its root span ends; per run, a
    window-sized ring, :data:`CALL_ID_MEMORY` call-id hashes and a few counters.

    Thread-safe: the signature (the costly part) is computed outside the engine's lock; the
    lock is held for one table update and one evaluation. No I/O, no logging, and time only from
    ``clock``.

    Args:
        policy: the loop policy.
        limits: per-run budgets (``None`` = none: no meter, model calls only counted).
        normalizer: the signature normalizer.
        clock: seconds, monotonic: only for the idle TTL and LRU bookkeeping.
        max_traces: runs kept at most.
        idle_ttl_s: seconds without activity after which a run is dropped.
        price: prices a model call without a reported cost (only under ``max_cost_usd``);
            ``None`` prices nothing.
        stats: the counters to count into (default: a fresh :class:`EngineStats`).

    Raises:
        ConfigError: for a bad policy, limits, ``max_traces`` or ``idle_ttl_s``.
    """

    def __init__(
        self,
        policy: LoopPolicy = DEFAULT_POLICY,
        *,
        limits: Limits | None = None,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
        clock: Callable[[], float],
        max_traces: int = DEFAULT_MAX_TRACES,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        price: PriceFn | None = None,
        stats: EngineStats | None = None,
    ) -> None:
        if not isinstance(policy, LoopPolicy):
            raise ConfigError("policy", policy, "a LoopPolicy")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a tripwire Limits, or None")
        _positive("max_traces", max_traces, "an integer >= 1", integer=True)
        _positive("idle_ttl_s", idle_ttl_s, "a number > 0", integer=False)
        self.policy = policy
        self.normalizer = normalizer
        self.limits = limits
        """The budgets enforced per run (``None``: none)."""
        self._limits = limits if limits is not None and limits.has_limits() else None
        self._clock = clock
        self.max_traces = max_traces
        self.idle_ttl_s = float(idle_ttl_s)
        self._price = price
        self._priced = limits is not None and limits.max_cost_usd is not None
        self.stats = stats if stats is not None else EngineStats()
        self._runs: OrderedDict[TraceId, _Run] = OrderedDict()
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Active runs."""
        return len(self._runs)

    def __contains__(self, trace_id: object) -> bool:
        return trace_id in self._runs

    def run_state(self, trace_id: TraceId) -> RunState | None:
        """The loop watcher's state of a run, or ``None`` (not active, or no tool call yet)."""
        run = self._runs.get(trace_id)
        return run.state if run is not None else None

    def verdict(self, trace_id: TraceId) -> Assessment | None:
        """The verdict in force for an active run, or ``None``."""
        state = self.run_state(trace_id)
        return state.current if state is not None else None

    def last_active(self, trace_id: TraceId) -> float | None:
        """The clock time of an active run's last tool call (or, with limits, model call), or
        ``None``; past ``idle_ttl_s`` ago, the run's next call starts it afresh."""
        run = self._runs.get(trace_id)
        return run.last_seen if run is not None else None

    def counters(self, trace_id: TraceId) -> RunCounters | None:
        """What an active run consumed, as the meter counts it (``None`` without limits)."""
        run = self._runs.get(trace_id)
        meter = run.meter if run is not None else None
        return meter.counters() if meter is not None else None

    # -- feeding ---------------------------------------------------------------------------------

    def observe(self, event: Event) -> tuple[Decision, ...]:
        """Feed one mapped span event; the decisions it brings, in order (usually none).

        A tool call is deduplicated by call id (partial or streamed spans of one execution
        count once; a span of a call id whose earlier span ended in error is a new attempt,
        counted with its attempt number), judged by the loop watcher and metered. A model call
        is metered (once per response id). A boundary restarts the loop window (a sub-agent
        ended) or ends the run (the root). A root span ends its run after it is judged, with a
        :class:`RunEnded` last.
        """
        if type(event) is ToolSpan:
            return self._tool(event)
        if type(event) is ModelSpan:
            return self._model(event)
        if type(event) is Boundary:
            return self._boundary(event)
        raise ConfigError("event", type(event).__name__, "a ToolSpan, ModelSpan or Boundary")

    def end(self, trace_id: TraceId, *, cause: str = "end") -> RunEnded | None:
        """Forget a run now (its root ended, or the caller knows it is over); what it came to,
        or ``None`` when it was not active."""
        with self._lock:
            run = self._runs.pop(trace_id, None)
        if run is None:
            return None
        self.stats.runs_ended += 1
        return self._ended(trace_id, run, cause)

    def evict_idle(self, now: float | None = None) -> int:
        """Drop the runs idle for longer than ``idle_ttl_s``; how many were dropped.

        Runs by itself whenever a new run starts; call it from a timer when runs can stop
        arriving for long periods.
        """
        with self._lock:
            return self._evict_idle(self._clock() if now is None else now)

    def clear(self) -> None:
        """Forget every run."""
        with self._lock:
            self._runs.clear()

    # -- the paths -------------------------------------------------------------------------------

    def _tool(self, event: ToolSpan) -> tuple[Decision, ...]:
        call = event.call
        normalizer = self.normalizer
        sig = event.signature
        if sig is None:
            sig = normalizer.signature(call.tool, call.arguments)  # outside the lock
        tid = event.trace_id
        stats = self.stats
        now = self._clock()
        stops: tuple[tuple[Stop, bool], ...] = ()
        meter: Meter | None = None
        lock = self._lock
        lock.acquire()
        try:
            runs = self._runs
            run = runs.get(tid)
            if run is not None and now - run.last_seen <= self.idle_ttl_s:
                run.last_seen = now  # _run_for's common case, inline
                runs.move_to_end(tid)
            else:
                run = self._run_for(tid, now)
            call_id = call.call_id
            if call_id is not None:
                attempt = self._seen_call(run, call_id, call.error_type is not None)
                if attempt == 0:
                    stats.duplicate_calls += 1
                    return _NONE
                if attempt > 1:
                    stats.attempts += 1
                    if call.attempt is None:
                        call = msgspec.structs.replace(call, attempt=attempt)
            stats.tool_calls += 1
            state = run.state
            if state is None:
                state = run.state = RunState.new(self.policy)
            previous = state.current
            digest = call.result_digest  # evaluate()'s result hash, inline: one call less
            assessment = evaluate_hashed(
                state, call, sig, (hash(digest) or 1) if digest is not None else 0,
                self.policy, normalizer, None,
            )
            repeated = (
                assessment is None
                and previous is not None
                and previous.verdict is _STUCK
                and state.last_trip == state.calls
            )
            meter = run.meter
            if self._limits is not None:
                if meter is None:
                    meter = run.meter = Meter(self._limits)
                untracked = meter.untracked
                stops = meter.tool_call(call.tool, call.start_s, call.end_s)
                stats.untracked_tools += meter.untracked - untracked
        finally:
            lock.release()
        if assessment is None and not stops and not repeated and not event.root:
            return _NONE  # the common case: nothing changed
        out = self._news(tid, previous, assessment, repeated, state, stops, meter)
        if event.root:
            ended = self.end(tid, cause="root")
            if ended is not None:
                out.append(ended)
        return tuple(out)

    def _news(
        self,
        tid: TraceId,
        previous: Assessment | None,
        assessment: Assessment | None,
        repeated: bool,
        state: RunState,
        stops: tuple[tuple[Stop, bool], ...],
        meter: Meter | None,
    ) -> list[Decision]:
        """The decisions one judged tool call brought (the rare case: something changed)."""
        stats = self.stats
        out: list[Decision] = []
        if assessment is not None and not (
            previous is None and assessment.verdict is _WORKING
        ):  # a run's first verdict, "working", is not news
            stats.verdict_changes += 1
            out.append(
                VerdictChanged(
                    trace_id=tid,
                    assessment=assessment,
                    previous=previous.verdict if previous is not None else None,
                )
            )
        elif repeated:
            assert previous is not None
            stats.still_stuck += 1
            held = state.current  # the stuck verdict again, counting this call
            out.append(
                StillStuck(trace_id=tid, assessment=held if held is not None else previous, call_index=state.calls)
            )
        if stops:
            assert meter is not None
            counters = meter.counters()
            for stop, tool_only in stops:
                stats.budget_stops += 1
                out.append(
                    BudgetStopped(
                        trace_id=tid,
                        stop=stop,
                        counters=counters,
                        tool_only=tool_only,
                    )
                )
        return out

    def observe_calls(
        self,
        trace_id: TraceId,
        calls: Sequence[ToolCall],
        signatures: Sequence[Signature | None],
        *,
        verdicts: list[Assessment | bool | None] | None = None,
    ) -> list[tuple[int, Decision]]:
        """Feed one run's tool calls in order; the decisions they bring, each with the index of
        the call that brought it.

        The same as :meth:`observe` of ``ToolSpan(trace_id=trace_id, call=calls[i],
        signature=signatures[i])`` for each ``i`` in turn (none of them a root), with the run
        looked up and the lock taken once for the batch, and the clock read once: the calls
        count as made at one instant. Replay feeds a whole recorded trace this way, the OTLP
        receiver each run of a request's tool calls of one trace.

        Args:
            verdicts: when given, one entry is appended per call: the verdict in force after
                it (what :meth:`verdict` would say then), or ``False`` for a second report of
                an execution already counted (it changed nothing). The receiver's timeline
                records each call's verdict from it.
        """
        if len(calls) != len(signatures):
            raise ConfigError("signatures", len(signatures), f"one per call ({len(calls)})")
        found: list[tuple[int, Decision]] = []
        if not calls:
            return found
        policy = self.policy
        normalizer = self.normalizer
        stats = self.stats
        limits = self._limits
        seen_call = self._seen_call
        replace = msgspec.structs.replace
        note = verdicts.append if verdicts is not None else None
        now = self._clock()
        with self._lock:
            run = self._run_for(trace_id, now)
            for i, call in enumerate(calls):
                sig = signatures[i]
                if sig is None:
                    sig = normalizer.signature(call.tool, call.arguments)
                call_id = call.call_id
                if call_id is not None:
                    attempt = seen_call(run, call_id, call.error_type is not None)
                    if attempt == 0:
                        stats.duplicate_calls += 1
                        if note is not None:
                            note(False)
                        continue
                    if attempt > 1:
                        stats.attempts += 1
                        if call.attempt is None:
                            call = replace(call, attempt=attempt)
                stats.tool_calls += 1
                state = run.state
                if state is None:
                    state = run.state = RunState.new(policy)
                previous = state.current
                digest = call.result_digest  # as in _tool
                assessment = evaluate_hashed(
                    state, call, sig, (hash(digest) or 1) if digest is not None else 0,
                    policy, normalizer, None,
                )
                if note is not None:
                    note(state.current)
                repeated = (
                    assessment is None
                    and previous is not None
                    and previous.verdict is _STUCK
                    and state.last_trip == state.calls
                )
                stops: tuple[tuple[Stop, bool], ...] = ()
                meter = run.meter
                if limits is not None:
                    if meter is None:
                        meter = run.meter = Meter(limits)
                    untracked = meter.untracked
                    stops = meter.tool_call(call.tool, call.start_s, call.end_s)
                    stats.untracked_tools += meter.untracked - untracked
                if assessment is None and not stops and not repeated:
                    continue
                for decision in self._news(trace_id, previous, assessment, repeated, state, stops, meter):
                    found.append((i, decision))
        return found

    def _model(self, event: ModelSpan) -> tuple[Decision, ...]:
        self.stats.model_calls += 1
        limits = self._limits
        if limits is None:
            if event.root:
                ended = self.end(event.trace_id, cause="root")
                return (ended,) if ended is not None else _NONE
            return _NONE
        call = event.call
        cost = self._cost(call) if self._priced else call.cost_usd
        tid = event.trace_id
        now = self._clock()
        stop: Stop | None = None
        counters: RunCounters | None = None
        with self._lock:
            run = self._run_for(tid, now)
            if call.call_id is not None and self._seen_call(run, "\x00m" + call.call_id, False) == 0:
                self.stats.duplicate_model_calls += 1
            else:
                meter = run.meter
                if meter is None:
                    meter = run.meter = Meter(limits)
                if cost is None and self._priced:
                    self.stats.unpriced_calls += 1
                stop = meter.model_call(
                    call.input_tokens, call.output_tokens, cost, call.start_s, call.end_s
                )
                if stop is not None:
                    counters = meter.counters()
        out: list[Decision] = []
        if stop is not None and counters is not None:
            self.stats.budget_stops += 1
            out.append(BudgetStopped(trace_id=tid, stop=stop, counters=counters, tool_only=False))
        if event.root:
            ended = self.end(tid, cause="root")
            if ended is not None:
                out.append(ended)
        return tuple(out) if out else _NONE

    def _boundary(self, event: Boundary) -> tuple[Decision, ...]:
        tid = event.trace_id
        if tid not in self._runs:  # unlocked peek: most boundaries end runs without tool calls
            return _NONE
        if event.root:
            ended = self.end(tid, cause="root")
            return (ended,) if ended is not None else _NONE
        with self._lock:
            run = self._runs.get(tid)
            if run is not None:
                run.state = None  # a sub-agent ended: restart the loop window, keep the budget
        return _NONE

    def _cost(self, call: ModelCall) -> float | None:
        if call.cost_usd is not None:
            return call.cost_usd
        price = self._price
        if price is None:
            return None
        return price(call.model, call.provider, call.input_tokens, call.output_tokens)

    # -- bookkeeping (lock held) -----------------------------------------------------------------

    @staticmethod
    def _seen_call(run: _Run, call_id: str, failed: bool) -> int:
        """0 when ``call_id`` was counted and this is a duplicate report of that execution; else
        the attempt number of this execution (1 for a new id), remembered."""
        key = hash(call_id)
        failures = run.failed_ids
        if failures is not None and key in failures:
            attempt = failures.pop(key) + 1  # the earlier execution failed: the next attempt
            if failed:
                failures[key] = attempt
            return attempt
        ids = run.call_ids
        packed = _pack_hash(key)
        if ids is not None:
            at = ids.find(packed)
            while at >= 0:
                if not at & 7:  # a whole entry, not bytes straddling two
                    return 0
                at = ids.find(packed, at + 1)
            run.call_ids = (ids[8:] if len(ids) >= 8 * CALL_ID_MEMORY else ids) + packed
        else:
            run.call_ids = packed
        if failed:
            if failures is None:
                failures = run.failed_ids = {}
            failures[key] = 1
            if len(failures) > CALL_ID_MEMORY:
                del failures[next(iter(failures))]
        return 1

    def _run_for(self, tid: TraceId, now: float) -> _Run:
        runs = self._runs
        run = runs.get(tid)
        if run is not None:
            if now - run.last_seen <= self.idle_ttl_s:
                run.last_seen = now
                runs.move_to_end(tid)
                return run
            del runs[tid]  # idle past the TTL but not swept yet: start afresh
            self.stats.evicted_idle += 1
        else:
            self._evict_idle(now)
        run = runs[tid] = _Run(now)
        while len(runs) > self.max_traces:
            runs.popitem(last=False)
            self.stats.evicted_lru += 1
        return run

    def _evict_idle(self, now: float) -> int:
        # Runs are kept in order of last activity: the expired ones are at the front.
        runs = self._runs
        limit = now - self.idle_ttl_s
        dropped = 0
        while runs:
            tid, run = next(iter(runs.items()))
            if run.last_seen >= limit:
                break
            del runs[tid]
            dropped += 1
        self.stats.evicted_idle += dropped
        return dropped

    def _ended(self, tid: TraceId, run: _Run, cause: str) -> RunEnded:
        state = run.state
        return RunEnded(
            trace_id=tid,
            cause=cause,
            verdict=state.current if state is not None else None,
            counters=run.meter.counters() if run.meter is not None else None,
            tool_calls=state.calls if state is not None else 0,
        )

    def __repr__(self) -> str:
        return (
            f"<Engine runs={len(self._runs)}/{self.max_traces} ttl={self.idle_ttl_s:g}s "
            f"policy={self.policy.version}{' budgets' if self._limits is not None else ''}>"
        )

