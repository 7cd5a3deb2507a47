"""The OpenTelemetry span processor: a thin shell over :class:`tripwire.engine.Engine`.

A tool span's path, in three sentences. :meth:`TripwireSpanProcessor.on_end` maps the span
once (a key pre-filter, :func:`~tripwire.spans.classify` and
:func:`~tripwire.spans.map_tool_span` on the SDK's own attribute dict). It hands the event to
the engine once (:meth:`~tripwire.engine.Engine.observe` signs, deduplicates, judges and meters
it under one short lock and returns decisions as values). Only when a decision came back does it
act on it once: raise the kill flag, call the callbacks, and annotate the span for the wrapped
processor.

:class:`TripwireSpanProcessor` sits in the trace pipeline, usually wrapped around the processor
that already exports the spans::

    provider.add_span_processor(
        TripwireSpanProcessor(BatchSpanProcessor(OTLPSpanExporter()))
    )

The engine keeps every run's state (loop watcher and budget meter, bounded in count and bytes:
see :mod:`tripwire.engine`); this module owns what is OpenTelemetry's: reading SDK spans, the
annotation, the kill flags (:mod:`tripwire.otel.killswitch`) and the callbacks, as the SDK's
``BatchSpanProcessor`` is a thin shell over its signal-agnostic ``BatchProcessor``.

Decisions
---------
When the verdict of a run changes, the processor

1. annotates the span with ``tripwire.verdict``, ``tripwire.rule``, ``tripwire.reason``,
   ``tripwire.period`` (and the call index and versions) *before* the wrapped processor sees
   it, so the annotation reaches its exporter;
2. calls the ``on_verdict`` callbacks;
3. on ``stuck``, raises the run's kill flag, which the agent runtime reads with
   :func:`tripwire.otel.check` before its next step. A stuck run that repeats itself again
   raises its flag again if it was lowered (nudge, then kill).

Budgets
-------
Given ``limits=`` (a :class:`~tripwire.core.budget.Limits`), the engine's
:class:`~tripwire.core.budget.Meter` counts, per trace, tool calls (all tools, and per tool when
a per-tool cap applies), model steps, input and output tokens and cost (from model-call spans,
each call once; a reported cost attribute first, else :class:`tripwire.prices.Pricer`), and the
time since the earliest start among the trace's tool and model spans. Spans arrive *after* the
work they record, so every check asks the question the runtime's next
:func:`~tripwire.otel.check` answers: "may the run take its next step?". A count cap of n is
reached when the n-th call *ends*: the (n+1)-th is refused by the runtime's check, as
:class:`tripwire.Guard` refuses it. Tokens, cost and time stop the run once their total is
``>=`` the limit. Per-tool caps raise a *tool flag* (only ``check(tool=...)`` raises it), the
others the run's flag; each is raised once per run, annotated on the span
(``tripwire.stop_reason``, ``tripwire.limit_name``, ``tripwire.limit``, ``tripwire.observed``)
and reported to the ``on_budget`` callbacks. Without ``limits`` none of this runs.

How the annotation reaches exporters
-------------------------------------
A span is read-only once ended: the SDK freezes its attributes before calling ``on_end``, and
every processor of the provider receives the same ``ReadableSpan``. The processor never mutates
that object. Instead, on a decision only, it builds a *derived* ``ReadableSpan`` (the same
name, context, parent, resource, events, links, kind, status, times and scope, with the original
attributes plus the ``tripwire.*`` ones) and passes that copy to the **wrapped** processor, as
the SDK itself builds a fresh ``ReadableSpan`` for ``on_end``. Processors registered *beside*
tripwire see the span without the annotation; standing alone (no wrapped processor), the
processor can instead emit a small ``tripwire.verdict`` child span through a ``tracer``.

Threads
-------
``on_end`` runs on the thread that ends the span. It never raises (one broad ``except`` at this
boundary: counted in :attr:`TripwireSpanProcessor.stats`, logged once) and never waits on I/O.
``on_start`` records the span's trace as this thread's (and asyncio task's) active run, so that
:func:`~tripwire.otel.check` finds the run where no span is current. Callbacks run on the
span-ending thread: keep them quick (hand work to a queue).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, cast

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.trace import StatusCode

from tripwire.core.budget import Limits, RunCounters, Stop
from tripwire.core.events import ModelCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.reasons import Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.core.watch import Assessment, RunState
from tripwire.engine import (
    DEFAULT_IDLE_TTL_S,
    DEFAULT_MAX_TRACES,
    Boundary,
    BudgetStopped,
    Decision,
    Engine,
    EngineStats,
    ModelSpan,
    StillStuck,
    ToolSpan,
    VerdictChanged,
)
from tripwire.otel.killswitch import KILL_FLAGS, KillFlags, note_active_run
from tripwire.prices import PriceFn, Pricer, genai_price
from tripwire.spans.mapping import (
    _INPUT_KEYS,
    _OUTPUT_KEYS,
    COST_ATTRIBUTES,
    MAPPING_VERSION,
    MappingStats,
    SpanRole,
    SpanView,
    _int,
    _tool_call,
    classify,
    map_model_span,
)

__all__ = [
    "BUDGET_SPAN_NAME",
    "COST_ATTRIBUTES",
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "VERDICT_SPAN_NAME",
    "BudgetCallback",
    "BudgetStop",
    "ProcessorStats",
    "TripwireSpanProcessor",
    "VerdictCallback",
    "VerdictChange",
]

logger = logging.getLogger("tripwire.otel")

VERDICT_SPAN_NAME: Final = "tripwire.verdict"
"""Name of the child span a standalone processor emits on a verdict change (with a tracer)."""

BUDGET_SPAN_NAME: Final = "tripwire.budget"
"""Name of the child span a standalone processor emits on a budget stop (with a tracer)."""

_UNSUPPORTED_LIMITS: Final = (
    "max_duplicate_calls",
    "max_no_progress_steps",
    "max_subagents",
    "tool_timeout_s",
)
"""Limits the span processor cannot enforce from spans (a warning at construction)."""

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})
_HAS_PARENT: Final = "parent"  # classify() only tests ``parent_span_id is None``
_ERROR: Final = StatusCode.ERROR
_TOOL: Final = SpanRole.TOOL
_MODEL: Final = SpanRole.MODEL
_RUN: Final = SpanRole.RUN
_OTHER: Final = SpanRole.OTHER
_NOOP_ON_START: Final = frozenset(
    (SpanProcessor.on_start, BatchSpanProcessor.on_start, SimpleSpanProcessor.on_start)
)
"""The SDK's ``on_start`` methods that do nothing: not forwarded to (one call less per span)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VerdictChange:
    """What an ``on_verdict`` callback receives: a run's verdict changed at one tool span."""

    trace_id: str
    """The run's trace id (32 hex)."""
    span_id: str
    """The tool span at which the verdict changed (16 hex)."""
    assessment: Assessment
    """The new verdict with its rule, tool, digest, hits, period, call index and reason."""
    previous: Verdict | None
    """The verdict before (``None`` at the run's first call)."""
    flagged: bool
    """True when this change raised the run's kill flag (``stuck``)."""


VerdictCallback = Callable[[VerdictChange], object]
"""An ``on_verdict`` callback. Runs on the span-ending thread: must be quick; may raise (the
exception is caught, counted and logged once)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetStop:
    """What an ``on_budget`` callback receives: a run reached a budget limit at one span."""

    trace_id: str
    """The run's trace id (32 hex)."""
    span_id: str
    """The tool or model span whose end reached the limit (16 hex)."""
    stop: Stop
    """The limit that fired: ``reason``, ``limit_name``, ``limit``, ``observed``, message."""
    counters: RunCounters
    """What the trace had consumed at that span."""
    tool_only: bool
    """True for a per-tool cap: a tool flag refuses that tool only (``check(tool=...)``)."""
    flagged: bool
    """True when the flag in force is this stop's; False when a loop flag already up was kept
    (a loop flag takes precedence over a budget flag)."""


BudgetCallback = Callable[[BudgetStop], object]
"""An ``on_budget`` callback. Runs on the span-ending thread: must be quick; may raise (the
exception is caught, counted and logged once)."""


@dataclass(slots=True)
class ProcessorStats(EngineStats):
    """Counters of one processor: the engine's, plus what the shell counts. Plain ints."""

    flags_raised: int = 0
    """Kill flags raised for loops (``stuck`` verdicts, and again after a lowered flag)."""
    callback_errors: int = 0
    """Exceptions raised by ``on_verdict`` and ``on_budget`` callbacks (caught)."""
    usage_errors: int = 0
    """Unusable usage or cost attributes on model spans (ignored, logged once)."""
    internal_errors: int = 0
    """Exceptions inside the processor itself (caught at the ``on_end`` boundary)."""


class TripwireSpanProcessor(SpanProcessor):
    """Watches tool spans per trace, annotates verdict changes, raises kill flags.

    Args:
        inner: the processor to wrap (usually the exporting ``BatchSpanProcessor``); it gets
            every span, annotated ones as a derived copy. ``None`` = stand alone.
        policy: the loop policy (default :data:`~tripwire.core.policy.DEFAULT_POLICY`).
        normalizer: the signature normalizer.
        on_verdict: a callback or callbacks, called with a :class:`VerdictChange` on each
            verdict change (on the span-ending thread).
        max_traces: active traces watched at most (LRU beyond it).
        idle_ttl_s: seconds without a tool span after which a trace's state is dropped.
        clock: monotonic seconds for the TTL (injectable for tests).
        flags: the kill-flag registry to raise flags in (default: the process-wide one that
            :func:`tripwire.otel.check` reads).
        tracer: standing alone, emit a ``tripwire.verdict`` child span through this tracer on
            each verdict change (and a ``tripwire.budget`` one on a budget stop), so exporters
            see it (ignored when ``inner`` is set: the span itself is annotated).
        limits: per-trace budgets (``None`` = none, and no cost on any span). Enforced from
            spans: ``max_tool_calls``, ``tool_caps``, ``default_tool_cap``, ``max_steps``,
            tokens, ``max_cost_usd``, ``max_duration_s``; the others warn at construction.
        on_budget: a callback or callbacks, called with a :class:`BudgetStop` when a trace
            reaches a limit (on the span-ending thread).
        prices: ``(model, provider, input_tokens, output_tokens) -> USD | None`` for
            ``max_cost_usd`` (default the ``genai-prices`` table; ``None`` prices nothing),
            called through :class:`tripwire.prices.Pricer` (never raises, warns once per model).

    Raises:
        ConfigError: for a bad ``max_traces``, ``idle_ttl_s`` or ``limits``.

    The SDK calls ``on_start``/``on_end`` on the thread that starts/ends the span; ``on_end``
    never raises and never blocks. Exceptions from the *wrapped* processor propagate exactly as
    they would without tripwire in front.
    """

    def __init__(
        self,
        inner: SpanProcessor | None = None,
        *,
        policy: LoopPolicy = DEFAULT_POLICY,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
        on_verdict: VerdictCallback | Iterable[VerdictCallback] = (),
        max_traces: int = DEFAULT_MAX_TRACES,
        idle_ttl_s: float = DEFAULT_IDLE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        flags: KillFlags | None = None,
        tracer: trace_api.Tracer | None = None,
        limits: Limits | None = None,
        on_budget: BudgetCallback | Iterable[BudgetCallback] = (),
        prices: PriceFn | None = genai_price,
    ) -> None:
        self.stats = ProcessorStats()
        """Counters (tool calls, duplicates, verdict changes, evictions, errors)."""
        priced = isinstance(limits, Limits) and limits.max_cost_usd is not None
        self._engine = Engine(
            policy,
            limits=limits,
            normalizer=normalizer,
            clock=clock,
            max_traces=max_traces,
            idle_ttl_s=idle_ttl_s,
            price=Pricer(prices, warn=False).cost if priced and prices is not None else None,
            stats=self.stats,
        )
        self._inner = inner
        self.policy = policy
        self._normalizer = normalizer
        self._callbacks: tuple[VerdictCallback, ...] = (
            (on_verdict,) if callable(on_verdict) else tuple(on_verdict)
        )
        self.flags = flags if flags is not None else KILL_FLAGS
        self._tracer = tracer
        self.limits = limits
        """The budgets enforced per trace (``None``: none)."""
        self._budgets = limits is not None and limits.has_limits()
        self._priced = priced
        self._budget_callbacks: tuple[BudgetCallback, ...] = (
            (on_budget,) if callable(on_budget) else tuple(on_budget)
        )
        if limits is not None:
            ignored = [n for n in _UNSUPPORTED_LIMITS if getattr(limits, n) is not None]
            if ignored:
                warnings.warn(
                    f"TripwireSpanProcessor cannot enforce {', '.join(ignored)} from spans "
                    "(use tripwire.Guard in the agent loop for them); they are ignored",
                    UserWarning,
                    stacklevel=2,
                )
        self._logged: set[str] = set()
        self._shutdown = False
        self.mapping_stats = MappingStats()
        """Counters of the span mapping (malformed tool spans are counted here)."""
        self._inner_on_start = (
            inner.on_start
            if inner is not None and not _does_nothing_on_start(inner)
            else None
        )
        if inner is not None:
            # The SDK calls _on_ending on every processor for every span, and tripwire only
            # forwards it: hand the SDK the wrapped processor's own method (one call per span
            # instead of two). Not when a subclass overrides it.
            ending = getattr(inner, "_on_ending", None)
            if ending is not None and type(self)._on_ending is TripwireSpanProcessor._on_ending:
                self._on_ending = ending  # type: ignore[method-assign]

    # -- introspection ---------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine that keeps the runs' state and decides."""
        return self._engine

    @property
    def inner(self) -> SpanProcessor | None:
        """The wrapped processor, if any."""
        return self._inner

    @property
    def normalizer(self) -> Normalizer:
        """The signature normalizer (set at construction)."""
        return self._normalizer

    @property
    def max_traces(self) -> int:
        """Active traces watched at most."""
        return self._engine.max_traces

    @property
    def idle_ttl_s(self) -> float:
        """Seconds without activity after which a trace's state is dropped."""
        return self._engine.idle_ttl_s

    def __len__(self) -> int:
        """Active traces being watched."""
        return len(self._engine)

    def run_state(self, trace_id: int | str) -> RunState | None:
        """The watcher state of a trace (for tests and diagnostics), or ``None`` (not watched,
        or no tool call yet)."""
        return self._engine.run_state(_tid(trace_id))

    def counters(self, trace_id: int | str) -> RunCounters | None:
        """What an active trace consumed, as the budgets count it (``None`` without ``limits``
        or when the trace is not watched). ``elapsed_s`` runs to the latest span end seen."""
        return self._engine.counters(_tid(trace_id))

    def verdict(self, trace_id: int | str) -> Assessment | None:
        """The verdict in force for an active trace, or ``None`` if it is not watched."""
        return self._engine.verdict(_tid(trace_id))

    # -- SpanProcessor -----------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Record the span's trace as this thread's (and task's) active run, then forward.

        The record is what lets :func:`~tripwire.otel.check` find the run in a tool body where
        the instrumentation made no span current (OpenInference's LangChain tracer).
        """
        try:
            s: Any = span
            try:
                tid = s._context.trace_id  # the SDK's field (a property call less per span)
            except AttributeError:
                tid = span.get_span_context().trace_id
            note_active_run(tid)
        except Exception as exc:
            # The agent-facing boundary (on_start runs on the agent's thread): a span without
            # a usable context is only not recorded. Counted, logged once.
            self.stats.internal_errors += 1
            self._log_once("on_start", "tripwire span processor failed on a span start: %r", exc)
        start = self._inner_on_start
        if start is not None:
            start(span, parent_context)

    def _on_ending(self, span: Span) -> None:
        # The SDK calls this (private) hook on every processor; forward it unchanged.
        inner = self._inner
        if inner is not None:
            inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        """Judge the span if it is an agent span, then hand it (maybe annotated) to ``inner``.

        Never raises for anything tripwire does; never blocks.
        """
        out = span
        if not self._shutdown:
            try:
                out = self._judge(span)
            except Exception as exc:
                # The agent-facing boundary: the SDK does not catch exceptions from on_end, so
                # anything raised here would escape from the agent's span.end() and skip the
                # wrapped processor. Count it, log it once, and pass the span on unjudged.
                self.stats.internal_errors += 1
                self._log_once("internal", "tripwire span processor failed on a span: %r", exc)
                out = span
        inner = self._inner
        if inner is not None:
            inner.on_end(out)

    def shutdown(self) -> None:
        """Stop judging, drop all per-trace state, shut the wrapped processor down. Idempotent."""
        if self._shutdown:
            return
        self._shutdown = True
        self._engine.clear()
        if self._inner is not None:
            self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped processor; True when it finished in time (or there is none)."""
        if self._inner is None:
            return True
        return bool(self._inner.force_flush(timeout_millis))

    # -- extension point -----------------------------------------------------------------------

    def observe_model_call(self, trace_id: int, call: ModelCall) -> None:
        """Called with each model-call span's usage (tokens, model), once per span.

        The hook for per-run budgets of one's own (a :class:`tripwire.Guard` fed the token
        usage of each trace). The default does nothing. Overrides run inside the ``on_end``
        boundary (their exceptions are caught and counted) and must not block.
        """

    # -- eviction ------------------------------------------------------------------------------

    def evict_idle(self, now: float | None = None) -> int:
        """Drop traces idle for longer than ``idle_ttl_s``; return how many were dropped.

        Runs by itself whenever a new trace starts; call it from a timer if traces can stop
        arriving for long periods.
        """
        return self._engine.evict_idle(now)

    def end_run(self, trace_id: int | str) -> bool:
        """Forget a trace's state now (its kill flag stays); True if it was watched."""
        return self._engine.end(_tid(trace_id)) is not None

    # -- the path ----------------------------------------------------------------------------

    def _judge(self, span: ReadableSpan) -> ReadableSpan:
        """Map the span once, hand it to the engine once, act on what comes back."""
        s: Any = span
        try:
            # An SDK span, read without its properties (see _attributes_of): the plain
            # attribute dict, the name, the parent, the context.
            attrs = s._attributes._dict
            name = s._name
            parent = s._parent
            tid: int = s._context.trace_id
        except AttributeError:
            attrs = None
        if type(attrs) is not dict or type(name) is not str:
            # A duck-typed span, or one whose name is not a string: the public API.
            attrs = _attributes_of(span)
            name = span.name
            parent = span.parent
            tid = span.context.trace_id
        root = parent is None or parent.is_remote
        # _role_of, inline (one call less per span; most spans stop at the four key tests).
        role: SpanRole
        if "gen_ai.operation.name" in attrs:
            if attrs["gen_ai.operation.name"] == "execute_tool":
                role = _TOOL
            else:
                role = classify(attrs, name, None if parent is None else _HAS_PARENT)
        elif not (
            "openinference.span.kind" in attrs
            or "traceloop.span.kind" in attrs
            or "gen_ai.tool.name" in attrs
            or (isinstance(name, str) and "tool" in name)
        ):
            if not root:
                return span
            role = _OTHER
        else:
            role = classify(attrs, name, None if parent is None else _HAS_PARENT)
        decisions: tuple[Decision, ...]
        if role is _TOOL:
            try:  # the SDK's fields, as above; the public properties for a duck-typed span
                start = s._start_time
                end = s._end_time
                failed = s._status._status_code is _ERROR
            except AttributeError:
                start, end = span.start_time, span.end_time
                failed = span.status.status_code is _ERROR
            call = _tool_call(
                attrs,
                name,
                None if start is None else start / 1e9,
                None if end is None else end / 1e9,
                (_exception_type(span) or "") if failed else None,
                self._normalizer,
            )
            if call is None:
                self.mapping_stats.malformed += 1
                if not root:
                    return span
                decisions = self._end(tid)
            else:
                self.mapping_stats.tool_spans += 1
                decisions = self._engine.observe(ToolSpan(trace_id=tid, call=call, root=root))
        elif role is _OTHER:
            if not root:
                return span
            decisions = self._end(tid)
        elif role is _RUN:
            decisions = self._engine.observe(Boundary(trace_id=tid, root=root))
        else:  # a model span
            model = map_model_span(_view_of(span, attrs))
            if model is None:
                if not root:
                    return span
                decisions = self._end(tid)
            else:
                self.mapping_stats.model_spans += 1
                self.observe_model_call(tid, model)
                if self._budgets:
                    self._check_usage(attrs, model)
                decisions = self._engine.observe(ModelSpan(trace_id=tid, call=model, root=root))
        if not decisions:
            return span
        return self._act(span, tid, decisions)

    def _end(self, tid: int) -> tuple[Decision, ...]:
        engine = self._engine
        if tid not in engine:  # most root spans belong to traces without agent spans
            return ()
        ended = engine.end(tid, cause="root")
        return (ended,) if ended is not None else ()

    def _check_usage(self, attrs: Mapping[str, Any], call: ModelCall) -> None:
        """Count (and log once) usage or cost attributes the mapping had to ignore."""
        if call.input_tokens == 0 or call.output_tokens == 0:
            for key in (*_INPUT_KEYS, *_OUTPUT_KEYS):
                value = attrs.get(key)
                if value is not None and _int(value) is None:
                    self.stats.usage_errors += 1
                    self._log_once(
                        "usage", "a model span has an unusable usage attribute %s; counted as 0",
                        key,
                    )
                    break
        if self._priced and call.cost_usd is None:
            for key in COST_ATTRIBUTES:
                if attrs.get(key) is not None:
                    self.stats.usage_errors += 1
                    self._log_once(
                        "cost", "a model span has an unusable cost attribute %s; ignored", key
                    )
                    break

    # -- acting on decisions -------------------------------------------------------------------

    def _act(
        self, span: ReadableSpan, tid: int, decisions: tuple[Decision, ...]
    ) -> ReadableSpan:
        """Raise the flags, call the callbacks; the span, annotated when something changed."""
        parts: list[tuple[str, dict[str, str | int | float]]] = []
        budget: dict[str, str | int | float] | None = None
        flags = self.flags
        for decision in decisions:
            kind = type(decision)
            if kind is VerdictChanged:
                d = cast(VerdictChanged, decision)
                flagged = d.stuck
                if flagged:
                    flags.raise_flag(tid, d.assessment)
                    self.stats.flags_raised += 1
                if self._callbacks:
                    change = VerdictChange(
                        trace_id=f"{tid:032x}",
                        span_id=f"{span.context.span_id:016x}",
                        assessment=d.assessment,
                        previous=d.previous,
                        flagged=flagged,
                    )
                    self._call_back(self._callbacks, change, "on_verdict")
                parts.append((VERDICT_SPAN_NAME, self._annotations(d.assessment)))
            elif kind is StillStuck:
                still = cast(StillStuck, decision)
                current = flags.get(tid)
                if current is None or not current.is_loop:  # lowered (nudged): raise it again
                    flags.raise_flag(tid, still.assessment)
                    self.stats.flags_raised += 1
            elif kind is BudgetStopped:
                b = cast(BudgetStopped, decision)
                budget = self._budget_stopped(span, tid, b)
        if budget is not None:
            parts.append((BUDGET_SPAN_NAME, budget))
        if not parts:
            return span
        return self._publish(span, parts)

    def _budget_stopped(
        self, span: ReadableSpan, tid: int, b: BudgetStopped
    ) -> dict[str, str | int | float]:
        """Raise the flag of one budget stop, call ``on_budget``; the span annotations."""
        stop = b.stop
        if b.tool_only:
            assert stop.tool is not None
            flag = self.flags.raise_tool_flag(tid, stop.tool, stop, counters=b.counters)
        else:
            flag = self.flags.raise_flag(tid, stop, counters=b.counters)
        annotations: dict[str, str | int | float] = {
            "tripwire.stop_reason": stop.reason.value,
            "tripwire.limit_name": stop.limit_name,
            "tripwire.limit": _number(stop.limit),
            "tripwire.observed": _number(stop.observed),
            "tripwire.mapping_version": MAPPING_VERSION,
        }
        if stop.tool is not None:
            annotations["tripwire.tool"] = stop.tool
        if self._budget_callbacks:
            event = BudgetStop(
                trace_id=f"{tid:032x}",
                span_id=f"{span.context.span_id:016x}",
                stop=stop,
                counters=b.counters,
                tool_only=b.tool_only,
                flagged=flag.stop is stop,
            )
            self._call_back(self._budget_callbacks, event, "on_budget")
        return annotations

    def _call_back(
        self, callbacks: tuple[Callable[[Any], object], ...], event: object, kind: str
    ) -> None:
        for callback in callbacks:
            try:
                callback(event)
            except Exception as exc:
                # User code at the agent-facing boundary: a broken callback must not stop
                # the annotation, the flag, the other callbacks, or the agent's span.end().
                self.stats.callback_errors += 1
                self._log_once(
                    f"callback:{id(callback)}", "tripwire %s callback %r failed: %r",
                    kind, callback, exc,
                )

    def _publish(
        self, span: ReadableSpan, parts: list[tuple[str, dict[str, str | int | float]]]
    ) -> ReadableSpan:
        """Make the annotations reach exporters: on the derived span handed to ``inner``, or
        as one child span per part through ``tracer`` standing alone."""
        if self._inner is not None:
            merged: dict[str, str | int | float] = {}
            for _, annotations in parts:
                merged.update(annotations)
            return _annotated(span, merged)
        if self._tracer is not None:
            for name, annotations in parts:
                self._emit_span(span, name, annotations)
        return span

    def _annotations(self, a: Assessment) -> dict[str, str | int | float]:
        out: dict[str, str | int | float] = {
            "tripwire.verdict": a.verdict.value,
            "tripwire.reason": a.reason,
            "tripwire.call_index": a.call_index,
            "tripwire.policy_version": a.policy_version or self.policy.version,
            "tripwire.normalizer_version": a.normalizer_version or self.normalizer.version,
            "tripwire.mapping_version": MAPPING_VERSION,
        }
        if a.rule is not None:
            out["tripwire.rule"] = a.rule.value
        if a.period is not None:
            out["tripwire.period"] = a.period
        if a.digest:
            out["tripwire.digest"] = a.digest[:16]
        if not a.arguments_seen:
            out["tripwire.arguments_seen"] = "false"
        return out

    def _emit_span(
        self, span: ReadableSpan, name: str, annotations: dict[str, str | int | float]
    ) -> None:
        tracer = self._tracer
        assert tracer is not None
        parent = trace_api.set_span_in_context(trace_api.NonRecordingSpan(span.context))
        at = span.end_time
        child = tracer.start_span(name, context=parent, attributes=annotations, start_time=at)
        child.end(end_time=at)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._logged or len(self._logged) > 64:
            return
        self._logged.add(key)
        logger.warning(message + " (logged once; see TripwireSpanProcessor.stats)", *args)

    def __repr__(self) -> str:
        return (
            f"<TripwireSpanProcessor inner={type(self._inner).__name__ if self._inner else None} "
            f"traces={len(self._engine)}/{self.max_traces} ttl={self.idle_ttl_s:g}s "
            f"policy={self.policy.version}"
            f"{' budgets' if self._budgets else ''}>"
        )


def _role_of(
    attrs: Mapping[str, Any], name: Any, parent: trace_api.SpanContext | None
) -> SpanRole:
    """:func:`~tripwire.spans.classify`, after a key pre-filter that settles most spans.

    A span with none of the keys ``classify`` reads, and no ``tool`` in its name (the one
    substring both of its name rules need), is no agent span: most spans stop at these four key
    tests. A GenAI ``execute_tool`` span is a tool span (``classify``'s first rule).
    ``tests/otel/test_fast_paths.py`` pins the agreement with ``classify``; ``_judge`` runs the
    same tests inline, and the same tests pin that it agrees.
    """
    if "gen_ai.operation.name" in attrs:
        if attrs["gen_ai.operation.name"] == "execute_tool":
            return _TOOL
    elif not (
        "openinference.span.kind" in attrs
        or "traceloop.span.kind" in attrs
        or "gen_ai.tool.name" in attrs
        or (isinstance(name, str) and "tool" in name)
    ):
        return _OTHER
    return classify(attrs, name, None if parent is None else _HAS_PARENT)


def _does_nothing_on_start(inner: SpanProcessor) -> bool:
    """True when ``inner.on_start`` is one of the SDK's empty ones (not overridden anywhere)."""
    if "on_start" in getattr(inner, "__dict__", ()):
        return False
    return getattr(type(inner), "on_start", None) in _NOOP_ON_START


def _tid(trace_id: int | str) -> int:
    return trace_id if isinstance(trace_id, int) else int(trace_id, 16)


def _attributes_of(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain ``dict`` when the SDK allows it, else the public proxy.

    Why: ``ReadableSpan.attributes`` is a read-only proxy over the SDK's ``BoundedAttributes``,
    a Python ``MutableMapping`` whose ``get`` raises and catches ``KeyError`` for every missing
    key. Recognizing a span is mostly missing keys, so the proxy costs ~0.4 µs per lookup where
    the ``dict`` behind it costs 0.04 µs. The ``dict`` is read, never written, and only after
    the span ended (the SDK has frozen it). If a future SDK renames these private fields, the
    public proxy is used: slower, same results (``test_fast_attributes_match_public`` pins it).
    """
    bounded = getattr(span, "_attributes", None)
    raw = getattr(bounded, "_dict", None)
    if type(raw) is dict:
        return raw
    return span.attributes or _EMPTY


class _SdkSpanView:
    """A :class:`~tripwire.spans.SpanView` of an SDK span, built cheaply.

    Why not :func:`~tripwire.spans.view_from_readable_span`: building the frozen
    12-field ``SpanView`` and formatting three hex ids cost ~3 µs per tool span, more than the
    whole budget tripwire has on the span's ``end()``. This view has the same attribute names
    and values (``tests/otel/test_processor.py`` compares every ``SpanView`` field), takes the
    plain attribute dict from :func:`_attributes_of`, and computes the ids, resource and scope
    only if the mapping reads them.
    """

    __slots__ = (
        "_span",
        "attributes",
        "end_s",
        "exception_type",
        "name",
        "start_s",
        "status_error",
        "status_message",
    )

    def __init__(self, span: ReadableSpan, attrs: Mapping[str, Any]) -> None:
        self._span = span
        self.attributes = attrs
        self.name = span.name
        start = span.start_time
        end = span.end_time
        self.start_s = start / 1e9 if start is not None else None
        self.end_s = end / 1e9 if end is not None else None
        status = span.status
        self.status_message = status.description
        self.status_error = status.status_code is StatusCode.ERROR
        self.exception_type = _exception_type(span) if self.status_error else None

    @property
    def trace_id(self) -> str:
        return f"{self._span.context.trace_id:032x}"

    @property
    def span_id(self) -> str:
        return f"{self._span.context.span_id:016x}"

    @property
    def parent_span_id(self) -> str | None:
        parent = self._span.parent
        return f"{parent.span_id:016x}" if parent is not None else None

    @property
    def resource_attributes(self) -> Mapping[str, Any] | None:
        resource = self._span.resource
        return resource.attributes if resource is not None else None

    @property
    def scope_name(self) -> str | None:
        scope = self._span.instrumentation_scope
        return scope.name if scope is not None else None


def _exception_type(span: ReadableSpan) -> str | None:
    """``exception.type`` of the span's first exception event, if any (read on failures only)."""
    for event in span.events:
        if event.name == "exception":
            value = (event.attributes or _EMPTY).get("exception.type")
            return value if isinstance(value, str) and value else None
    return None


def _view_of(span: ReadableSpan, attrs: Mapping[str, Any]) -> SpanView:
    """The view the mapping reads (a :class:`_SdkSpanView`, typed as the ``SpanView`` it mimics)."""
    return cast(SpanView, _SdkSpanView(span, attrs))


def _number(value: float) -> int | float:
    """An int when the value is whole (span attributes ``tripwire.limit``/``observed``)."""
    return int(value) if float(value).is_integer() else float(value)


def _annotated(span: ReadableSpan, annotations: dict[str, str | int | float]) -> ReadableSpan:
    """A copy of an ended span with ``annotations`` added to its attributes.

    Built with the public ``ReadableSpan`` constructor, as the SDK builds the span it hands to
    ``on_end``; the original span is not touched. The attribute count limit is not applied
    again (the ``tripwire.*`` attributes are always kept), and the dropped-attribute count of
    the original carries over.
    """
    merged: dict[str, Any] = dict(span.attributes or _EMPTY)
    merged.update(annotations)
    attributes = BoundedAttributes(maxlen=None, attributes=merged, immutable=True)
    attributes.dropped = span.dropped_attributes
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
