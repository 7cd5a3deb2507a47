"""The OpenTelemetry span processor that watches every agent's tool calls for loops.

:class:`TripwireSpanProcessor` sits in the trace pipeline, usually wrapped around the
processor that already exports the spans::

    provider.add_span_processor(
        TripwireSpanProcessor(BatchSpanProcessor(OTLPSpanExporter()))
    )

For each finished span it asks what the span is: four key tests on the SDK's attribute dict
and one substring test on the name reject a span that is no agent span (most spans stop
there, having cost about as much as one Python call); the others go to
:func:`~tripwire.otel.conventions.classify`. A tool span is mapped to a
:class:`~tripwire.core.events.ToolCall` and fed to that trace's loop watcher
(:func:`tripwire.core.watch.evaluate`). When the verdict of a run changes, the processor

1. annotates the span with ``tripwire.verdict``, ``tripwire.rule``, ``tripwire.reason``,
   ``tripwire.period`` (and the call index and versions) *before* the wrapped processor
   sees it, so the annotation reaches its exporter;
2. calls the ``on_verdict`` callbacks;
3. on ``stuck``, raises the run's kill flag (:mod:`tripwire.otel.killswitch`), which the
   agent runtime reads with :func:`tripwire.otel.check` before its next step.

Budgets
-------
Given ``limits=`` (a :class:`~tripwire.core.budget.Limits`), the processor also counts, per
trace, tool calls (all tools, and per tool when a per-tool cap applies), model steps, input
and output tokens and cost (from model-call spans, each call once), and the time since the
earliest start among the trace's tool and model spans. Spans arrive *after* the work they
record, so every check asks the question the runtime's next :func:`~tripwire.otel.check`
answers: "may the run take its next step?". A count cap of n (``max_tool_calls``,
``max_steps``) is therefore reached, and the flag raised, when the n-th call *ends*: the
(n+1)-th is refused by the runtime's check, as :class:`tripwire.Guard` refuses it. Tokens,
cost and time stop the run once their total is ``>=`` the limit. The decisions are the pure
functions of :mod:`tripwire.core.budget` (``check_charges``, ``check_before_step``,
``check_duration``). Per-tool caps raise a *tool flag* (only ``check(tool=...)`` raises it), the
others the run's flag; each is raised once per run, annotated on the span
(``tripwire.stop_reason``, ``tripwire.limit_name``, ``tripwire.limit``, ``tripwire.observed``)
and reported to the ``on_budget`` callbacks. Without ``limits`` none of this runs.

How the annotation reaches exporters
-------------------------------------
A span is read-only once ended: the SDK freezes its attributes before calling ``on_end``, and
every processor of the provider receives the same ``ReadableSpan``. The processor never
mutates that object (another processor may be exporting it on its own thread). Instead, on a
verdict change only, it builds a *derived* ``ReadableSpan``: the same name, context, parent,
resource, events, links, kind, status, times and scope, with the original attributes plus
the ``tripwire.*`` ones, and passes that copy to the **wrapped** processor. This is what the
SDK itself does (``Span._readable_span()`` builds a fresh ``ReadableSpan`` for ``on_end``),
and it uses only the public constructor. Consequences:

- processors registered *beside* tripwire on the provider see the span without the
  annotation; wrap the exporting processor to get it exported;
- standing alone (no wrapped processor), the processor can instead emit a small
  ``tripwire.verdict`` child span of the tool span through a ``tracer`` (what
  :func:`tripwire.otel.instrument` does when it has nothing to wrap), which every processor
  of the provider exports.

Memory bounds
-------------
One :class:`_Run` per active trace: the watcher's ring (:class:`~tripwire.core.watch.RunState`)
and a ring of recent call-id hashes, plus, with ``limits``, a few counters (:class:`_Budget`,
about 270 bytes). A run is dropped when the trace's local root span ends (no parent, or a
remote parent), when a run-boundary span ends (``invoke_agent …``, an OpenInference ``AGENT``
span…: a sub-agent's end restarts the trace's window, which can delay a detection but never
causes one; with budgets only the loop watcher restarts, the budget counters are the whole
trace's), after ``idle_ttl_s`` without a tool (or, with budgets, model) span, and least
recently used first beyond ``max_traces``. Kill flags live in their own bounded registry.

Threads
-------
``on_end`` runs on the thread that ends the span. It never raises (one broad ``except`` at
this boundary: counted in :attr:`TripwireSpanProcessor.stats`, logged once) and never waits
on I/O: the only lock is held for the few microseconds of a table update and one evaluation.
Callbacks run on the same thread: keep them quick (hand work to a queue).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, cast

from opentelemetry import trace as trace_api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import StatusCode

from tripwire.core.budget import (
    NANO,
    Charge,
    Limits,
    RunCounters,
    Stop,
    check_before_step,
    check_charges,
    check_duration,
    plan_tool_calls,
)
from tripwire.core.events import ModelCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.reasons import Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.core.watch import Assessment, RunState, evaluate
from tripwire.errors import ConfigError
from tripwire.otel.conventions import (
    _INPUT_KEYS,
    _OUTPUT_KEYS,
    MAPPING_VERSION,
    MappingStats,
    SpanRole,
    SpanView,
    _int,
    _tool_call,
    classify,
    map_model_span,
)
from tripwire.otel.killswitch import KILL_FLAGS, KillFlags
from tripwire.prices import PriceFn, genai_price

__all__ = [
    "BUDGET_SPAN_NAME",
    "COST_ATTRIBUTES",
    "DEFAULT_IDLE_TTL_S",
    "DEFAULT_MAX_TRACES",
    "MAX_TOOLS_PER_TRACE",
    "VERDICT_SPAN_NAME",
    "BudgetCallback",
    "BudgetStop",
    "ProcessorStats",
    "TripwireSpanProcessor",
    "VerdictCallback",
    "VerdictChange",
]

logger = logging.getLogger("tripwire.otel")

DEFAULT_MAX_TRACES: Final = 10_000
"""Active traces watched at most; beyond it the least recently active one is dropped."""

DEFAULT_IDLE_TTL_S: Final = 15 * 60.0
"""A trace with no tool span for this long (15 minutes) is dropped."""

CALL_ID_MEMORY: Final = 16
"""Recent call ids remembered per trace to count partial/streamed spans of one call once."""

VERDICT_SPAN_NAME: Final = "tripwire.verdict"
"""Name of the child span a standalone processor emits on a verdict change (with a tracer)."""

BUDGET_SPAN_NAME: Final = "tripwire.budget"
"""Name of the child span a standalone processor emits on a budget stop (with a tracer)."""

MAX_TOOLS_PER_TRACE: Final = 64
"""Distinct tools counted per trace for per-tool caps; beyond it new tools are not counted
(``ProcessorStats.untracked_tools``, logged once). Only capped tools are counted at all."""

COST_ATTRIBUTES: Final = ("operation.cost", "llm.cost.total", "gen_ai.usage.cost")
"""Span attributes read as a model call's reported cost in USD (pydantic-ai, OpenInference,
Langfuse-style), first present wins; without one the cost comes from the price table."""

_UNSUPPORTED_LIMITS: Final = (
    "max_duplicate_calls",
    "max_no_progress_steps",
    "max_subagents",
    "tool_timeout_s",
)
"""Limits the span processor cannot enforce from spans (a warning at construction)."""
_MAX_PLANS: Final = 1024

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})
_HAS_PARENT: Final = "parent"  # classify() only tests ``parent_span_id is None``
_ERROR: Final = StatusCode.ERROR


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
class ProcessorStats:
    """Counters of one processor. Plain ints: diagnostics, not budgets."""

    tool_calls: int = 0
    """Tool spans judged."""
    duplicate_calls: int = 0
    """Tool spans skipped because their call id was already counted (partial/streamed)."""
    model_calls: int = 0
    """Model-call spans seen (handed to :meth:`TripwireSpanProcessor.observe_model_call`)."""
    verdict_changes: int = 0
    """Verdict changes (annotated spans)."""
    flags_raised: int = 0
    """Kill flags raised (``stuck`` verdicts)."""
    runs_ended: int = 0
    """Per-trace states dropped because the run's root or boundary span ended."""
    evicted_idle: int = 0
    """Per-trace states dropped after the idle TTL."""
    evicted_lru: int = 0
    """Per-trace states dropped because ``max_traces`` was reached."""
    callback_errors: int = 0
    """Exceptions raised by ``on_verdict`` and ``on_budget`` callbacks (caught)."""
    duplicate_model_calls: int = 0
    """Model spans not counted again for budgets: their ``gen_ai.response.id`` was counted."""
    budget_stops: int = 0
    """Budget limits reached (run flags and tool flags raised)."""
    unpriced_calls: int = 0
    """Model calls with no known price under ``max_cost_usd``: their cost is not counted."""
    usage_errors: int = 0
    """Unusable usage or cost attributes, and failed price lookups (ignored, logged once)."""
    untracked_tools: int = 0
    """Tool calls not counted per tool because a trace had ``MAX_TOOLS_PER_TRACE`` tools."""
    internal_errors: int = 0
    """Exceptions inside the processor itself (caught at the ``on_end`` boundary)."""

    def as_dict(self) -> dict[str, int]:
        """The counters by name."""
        return {name: getattr(self, name) for name in self.__slots__}


class _Budget:
    """The per-trace budget counters (only with ``limits``)."""

    __slots__ = (
        "by_tool",
        "cost_nusd",
        "first_start_ns",
        "input_tokens",
        "last_end_ns",
        "output_tokens",
        "steps",
        "stopped",
        "tool_calls",
        "tool_stops",
        "unpriced",
    )

    def __init__(self, start_ns: int) -> None:
        self.steps = 0
        self.tool_calls = 0
        self.by_tool: dict[str, int] | None = None
        """Calls per capped tool (allocated at the first capped tool)."""
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_nusd = 0
        """Cost in integer nano-dollars (exact sums)."""
        self.unpriced = 0
        self.first_start_ns = start_ns
        """The earliest start among the trace's tool and model spans (ns since the epoch)."""
        self.last_end_ns = start_ns
        """The latest end among them."""
        self.stopped = False
        """The run's budget flag was raised (it is raised once per run)."""
        self.tool_stops: set[str] | None = None
        """Tools whose tool flag was raised."""

    def see(self, span: ReadableSpan) -> float:
        """Widen the run's time span to ``span``; return the seconds from its start to now."""
        start = span.start_time
        if start is not None and start < self.first_start_ns:
            self.first_start_ns = start
        end = span.end_time
        if end is not None and end > self.last_end_ns:
            self.last_end_ns = end
        return self.elapsed_s

    @property
    def elapsed_s(self) -> float:
        return max(0, self.last_end_ns - self.first_start_ns) / 1e9

    def counters(self) -> RunCounters:
        elapsed_s = self.elapsed_s
        return RunCounters(
            steps=self.steps,
            tool_calls=self.tool_calls,
            tool_calls_by_tool=dict(self.by_tool or {}),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_nusd / NANO,
            unpriced_calls=self.unpriced,
            elapsed_s=elapsed_s,
        )


_pack_hash: Final = struct.Struct("<q").pack


def _py_remember_id(ids: bytes | None, text: str, memory: int) -> bytes:
    """``ids`` itself when it holds the hash of ``text``, else ``ids`` with that hash appended.

    A memory of recent ids as ``bytes``: the ``hash()`` of up to ``memory`` ids, 8 bytes each,
    oldest first (``None`` is the empty memory); the oldest is dropped beyond ``memory``.
    ``bytes`` rather than an ``array``: ``bytes.find`` searches in C where ``in`` on an array
    makes an ``int`` of every element. Eight bytes per id whatever the id's length: the memory
    is bounded in bytes as well as in count.
    """
    key = _pack_hash(hash(text))
    if ids is None:
        return key
    at = ids.find(key)
    while at >= 0:
        if not at & 7:  # a whole entry, not bytes straddling two
            return ids
        at = ids.find(key, at + 1)
    return (ids[8:] if len(ids) >= 8 * memory else ids) + key


_remember_id: Final = _py_remember_id


class _Run:
    """The per-trace state: the watcher's ring, recent call ids, last activity, budget."""

    __slots__ = ("budget", "call_ids", "last_seen", "state")

    def __init__(self, state: RunState | None, now: float) -> None:
        self.state = state
        """The loop watcher (``None`` until the trace's first tool call, with budgets)."""
        self.last_seen = now
        self.call_ids: bytes | None = None
        """The hashes of the last ``CALL_ID_MEMORY`` call ids (see :func:`_py_remember_id`);
        ``None`` until the first call id."""
        self.budget: _Budget | None = None
        """Budget counters (only with ``limits``)."""

    def seen_call(self, call_id: str) -> bool:
        """True if ``call_id`` was counted recently; else remember it and return False."""
        ids = self.call_ids
        remembered = _remember_id(ids, call_id, CALL_ID_MEMORY)
        if remembered is ids:
            return True
        self.call_ids = remembered
        return False


def _check_positive(name: str, value: Any, expected: str, *, integer: bool) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not value > 0:
        raise ConfigError(name, value, expected)


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
            ``max_cost_usd`` (default the ``genai-prices`` table; ``None`` prices nothing).

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
        if not isinstance(policy, LoopPolicy):
            raise ConfigError("policy", policy, "a LoopPolicy")
        if limits is not None and not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a tripwire Limits, or None")
        _check_positive("max_traces", max_traces, "an integer >= 1", integer=True)
        _check_positive("idle_ttl_s", idle_ttl_s, "a number > 0", integer=False)
        self._inner = inner
        self.policy = policy
        self._normalizer = normalizer
        self._callbacks: tuple[VerdictCallback, ...] = (
            (on_verdict,) if callable(on_verdict) else tuple(on_verdict)
        )
        self.max_traces = max_traces
        self.idle_ttl_s = float(idle_ttl_s)
        self._clock = clock
        self.flags = flags if flags is not None else KILL_FLAGS
        self._tracer = tracer
        self.limits = limits
        """The budgets enforced per trace (``None``: none)."""
        self._limits = limits if limits is not None and limits.has_limits() else None
        self._budget_callbacks: tuple[BudgetCallback, ...] = (
            (on_budget,) if callable(on_budget) else tuple(on_budget)
        )
        self._prices = prices
        self._plans: dict[str, tuple[Charge, ...]] = {}
        self._priced = limits is not None and limits.max_cost_usd is not None
        self._per_tool = limits is not None and (
            bool(limits.tool_caps) or limits.default_tool_cap is not None
        )
        self._unpriced_models: set[str] = set()
        if limits is not None:
            ignored = [n for n in _UNSUPPORTED_LIMITS if getattr(limits, n) is not None]
            if ignored:
                warnings.warn(
                    f"TripwireSpanProcessor cannot enforce {', '.join(ignored)} from spans "
                    "(use tripwire.Guard in the agent loop for them); they are ignored",
                    UserWarning,
                    stacklevel=2,
                )
        self._runs: OrderedDict[int, _Run] = OrderedDict()
        self._lock = threading.Lock()
        self._logged: set[str] = set()
        self._shutdown = False
        self.stats = ProcessorStats()
        """Counters (tool calls, duplicates, verdict changes, evictions, errors)."""
        self.mapping_stats = MappingStats()
        """Counters of the span mapping (malformed tool spans are counted here)."""
        if inner is not None:
            # The SDK calls on_start and _on_ending on every processor for every span, and
            # tripwire only forwards them: hand the SDK the wrapped processor's own methods (one
            # call per span instead of two). Not when a subclass overrides them.
            cls = type(self)
            if cls.on_start is TripwireSpanProcessor.on_start:
                self.on_start = inner.on_start  # type: ignore[method-assign]
            ending = getattr(inner, "_on_ending", None)
            if ending is not None and cls._on_ending is TripwireSpanProcessor._on_ending:
                self._on_ending = ending  # type: ignore[method-assign]

    # -- introspection ---------------------------------------------------------------------

    @property
    def inner(self) -> SpanProcessor | None:
        """The wrapped processor, if any."""
        return self._inner

    @property
    def normalizer(self) -> Normalizer:
        """The signature normalizer (set at construction)."""
        return self._normalizer

    def __len__(self) -> int:
        """Active traces being watched."""
        return len(self._runs)

    def run_state(self, trace_id: int | str) -> RunState | None:
        """The watcher state of a trace (for tests and diagnostics), or ``None`` (not watched,
        or no tool call yet)."""
        tid = trace_id if isinstance(trace_id, int) else int(trace_id, 16)
        run = self._runs.get(tid)
        return run.state if run is not None else None

    def counters(self, trace_id: int | str) -> RunCounters | None:
        """What an active trace consumed, as the budgets count it (``None`` without ``limits``
        or when the trace is not watched). ``elapsed_s`` runs to the latest span end seen."""
        tid = trace_id if isinstance(trace_id, int) else int(trace_id, 16)
        run = self._runs.get(tid)
        budget = run.budget if run is not None else None
        if budget is None:
            return None
        return budget.counters()

    def verdict(self, trace_id: int | str) -> Assessment | None:
        """The verdict in force for an active trace, or ``None`` if it is not watched."""
        state = self.run_state(trace_id)
        return state.current if state is not None else None

    # -- SpanProcessor -----------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Forward to the wrapped processor; tripwire judges finished spans only.

        With a wrapped processor, the constructor replaces this method by the wrapped one's
        ``on_start`` on the instance (and ``_on_ending`` likewise): the SDK then calls it
        directly.
        """
        inner = self._inner
        if inner is not None:
            inner.on_start(span, parent_context=parent_context)

    def _on_ending(self, span: Span) -> None:
        # The SDK calls this (private) hook on every processor; forward it unchanged.
        inner = self._inner
        if inner is not None:
            inner._on_ending(span)

    def on_end(self, span: ReadableSpan) -> None:
        """Judge the span if it is a tool call, then hand it (maybe annotated) to ``inner``.

        Never raises for anything tripwire does; never blocks.
        """
        out = span
        if not self._shutdown:
            s: Any = span
            try:
                try:
                    # An SDK span, read without its properties (see _attributes_of): the plain
                    # attribute dict, the name, the parent. A duck-typed span, or one whose name
                    # is not a string, takes the general path (_observe).
                    attrs = s._attributes._dict
                    name = s._name
                    parent = s._parent
                    named_tool = "tool" in name
                except (AttributeError, TypeError):
                    attrs = None
                if type(attrs) is not dict:
                    out = self._observe(span)
                elif "gen_ai.operation.name" in attrs:
                    if attrs["gen_ai.operation.name"] == "execute_tool":  # classify()'s first rule
                        out = self._tool(span, attrs, name)
                        if parent is None or parent.is_remote:
                            self._end_run(span)
                    else:
                        out = self._agent_span(span, attrs, name, parent)
                elif (
                    # The other keys classify() reads, and the one substring both of its name
                    # rules need: a span with none of them is no agent span (most spans stop
                    # here; tests/otel/test_fast_paths.py pins the agreement with classify).
                    "openinference.span.kind" in attrs
                    or "traceloop.span.kind" in attrs
                    or "gen_ai.tool.name" in attrs
                    or named_tool
                ):
                    out = self._agent_span(span, attrs, name, parent)
                elif parent is None or parent.is_remote:
                    self._end_run(span)
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
        with self._lock:
            self._runs.clear()
        if self._inner is not None:
            self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Flush the wrapped processor; True when it finished in time (or there is none)."""
        if self._inner is None:
            return True
        return bool(self._inner.force_flush(timeout_millis))

    # -- extension point -----------------------------------------------------------------------

    def observe_model_call(self, trace_id: int, call: ModelCall) -> None:
        """Called with each model-call span's usage (tokens, model), once per call.

        The hook for per-run budgets (a :class:`tripwire.Guard` fed the token usage of each
        trace). The default does nothing. Overrides run inside the ``on_end`` boundary (their
        exceptions are caught and counted) and must not block.
        """

    # -- eviction ------------------------------------------------------------------------------

    def evict_idle(self, now: float | None = None) -> int:
        """Drop traces idle for longer than ``idle_ttl_s``; return how many were dropped.

        Runs by itself whenever a new trace starts; call it from a timer if traces can stop
        arriving for long periods.
        """
        with self._lock:
            return self._evict_idle(self._clock() if now is None else now)

    def end_run(self, trace_id: int | str) -> bool:
        """Forget a trace's watcher state now (its kill flag stays); True if it was watched."""
        tid = trace_id if isinstance(trace_id, int) else int(trace_id, 16)
        with self._lock:
            return self._runs.pop(tid, None) is not None

    # -- the hot path ----------------------------------------------------------------------------

    def _observe(self, span: ReadableSpan) -> ReadableSpan:
        """The general path, through the public ``ReadableSpan`` API (any duck-typed span)."""
        return self._agent_span(span, _attributes_of(span), span.name, span.parent)

    def _agent_span(
        self,
        span: ReadableSpan,
        attrs: Mapping[str, Any],
        name: str,
        parent: trace_api.SpanContext | None,
    ) -> ReadableSpan:
        root = parent is None or parent.is_remote
        if attrs.get("gen_ai.operation.name") == "execute_tool":  # classify()'s first rule
            role = SpanRole.TOOL
        else:
            role = classify(attrs, name, None if parent is None else _HAS_PARENT)
        if role is SpanRole.OTHER:
            if root:
                self._end_run(span)
            return span
        if role is SpanRole.TOOL:
            out = self._tool(span, attrs, name)
            if root:
                self._end_run(span)
            return out
        if role is SpanRole.RUN:
            self._end_run(span, root=root)
            return span
        # SpanRole.MODEL
        call = map_model_span(_view_of(span, attrs))
        out = span
        if call is not None:
            self.stats.model_calls += 1
            self.mapping_stats.model_spans += 1
            self.observe_model_call(span.context.trace_id, call)
            if self._limits is not None:
                out = self._model(span, attrs, call)
        if root:
            self._end_run(span)
        return out

    def _end_run(self, span: ReadableSpan, *, root: bool = True) -> None:
        tid = span.context.trace_id
        runs = self._runs
        if tid in runs:  # unlocked peek: most root spans have no tool calls
            with self._lock:
                run = runs.get(tid)
                if run is None:
                    return
                if not root and run.budget is not None:
                    run.state = None  # a sub-agent ended: restart the watcher, keep the budget
                    return
                del runs[tid]
                self.stats.runs_ended += 1

    def _tool(self, span: ReadableSpan, attrs: Mapping[str, Any], name: str) -> ReadableSpan:
        s: Any = span
        try:  # the SDK's fields, as in on_end; the public properties for a duck-typed span
            start = s._start_time
            end = s._end_time
            failed = s._status._status_code is _ERROR
            ctx = s._context
        except AttributeError:
            start, end, ctx = span.start_time, span.end_time, span.context
            failed = span.status.status_code is _ERROR
        normalizer = self._normalizer
        # The mapping and the signature (parse, canonicalize, hash), the costly part, outside
        # the lock.
        call = _tool_call(
            attrs,
            name,
            None if start is None else start / 1e9,
            None if end is None else end / 1e9,
            (_exception_type(span) or "") if failed else None,
            normalizer,
        )
        if call is None:
            self.mapping_stats.malformed += 1
            return span
        sig = normalizer.signature(call.tool, call.arguments)
        self.mapping_stats.tool_spans += 1
        tid: int = ctx.trace_id
        now = self._clock()
        stops: list[tuple[Stop, bool]] | None = None
        lock = self._lock
        lock.acquire()
        try:
            runs = self._runs
            run = runs.get(tid)
            if run is not None and now - run.last_seen <= self.idle_ttl_s:
                run.last_seen = now  # _run_for(), inlined for a trace already watched
                runs.move_to_end(tid)
            else:
                run = self._run_for(tid, now)
            call_id = call.call_id
            if call_id is not None:
                ids = run.call_ids  # run.seen_call(call_id), inlined
                remembered = _remember_id(ids, call_id, CALL_ID_MEMORY)
                if remembered is ids:
                    self.stats.duplicate_calls += 1
                    return span
                run.call_ids = remembered
            self.stats.tool_calls += 1
            state = run.state
            if state is None:
                state = run.state = RunState.new(self.policy)
            previous = state.current
            assessment = evaluate(state, call, self.policy, normalizer, signature=sig)
            if self._limits is not None:
                stops = self._charge_tool(self._limits, run, span, call.tool)
        finally:
            lock.release()
        if assessment is None and not stops:
            return span  # the verdict did not change: the common case
        # A run's first verdict, "working", is not news: nothing to report.
        changed = assessment is not None and not (
            previous is None and assessment.verdict is Verdict.WORKING
        )
        if not changed and not stops:
            return span
        parts: list[tuple[str, dict[str, str | int | float]]] = []
        if changed:
            assert assessment is not None
            parts.append((VERDICT_SPAN_NAME, self._changed(span, tid, assessment, previous)))
        if stops:
            parts.append((BUDGET_SPAN_NAME, self._budget_stopped(span, tid, run, stops)))
        return self._publish(span, parts)

    def _run_for(self, tid: int, now: float, *, watch: bool = True) -> _Run:
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
        run = runs[tid] = _Run(RunState.new(self.policy) if watch else None, now)
        while len(runs) > self.max_traces:
            runs.popitem(last=False)
            self.stats.evicted_lru += 1
        return run

    # -- budgets (only with ``limits``) ----------------------------------------------------------

    def _budget_of(self, run: _Run, span: ReadableSpan) -> _Budget:
        budget = run.budget
        if budget is None:
            start = span.start_time
            budget = run.budget = _Budget(start if start is not None else 0)
        return budget

    def _plan(self, limits: Limits, tool: str) -> tuple[Charge, ...]:
        plan = self._plans.get(tool)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            plan = self._plans[tool] = plan_tool_calls(limits, (tool,))
        return plan

    def _charge_tool(
        self, limits: Limits, run: _Run, span: ReadableSpan, tool: str
    ) -> list[tuple[Stop, bool]] | None:
        """Count one finished tool call; the stops it brings (``(stop, tool_only)``).

        Called with the lock held. The question is the runtime's next ``check()``'s: would
        one more call of this tool (per-tool cap), one more tool call (``max_tool_calls``), or
        the next step (deadline) go over?
        """
        budget = self._budget_of(run, span)
        elapsed = budget.see(span)
        budget.tool_calls += 1
        stops: list[tuple[Stop, bool]] | None = None
        plan = self._plan(limits, tool)
        if self._per_tool and plan[0].cap is not None:
            by_tool = budget.by_tool
            if by_tool is None:
                by_tool = budget.by_tool = {}
            used = by_tool.get(tool)
            if used is None and len(by_tool) >= MAX_TOOLS_PER_TRACE:
                self.stats.untracked_tools += 1
                self._log_once(
                    "untracked_tools",
                    "a trace called more than %d capped tools; the others are not counted",
                    MAX_TOOLS_PER_TRACE,
                )
            else:
                by_tool[tool] = used = (used or 0) + 1
                stopped_tools = budget.tool_stops
                if stopped_tools is None or tool not in stopped_tools:
                    stop = check_charges(plan[:-1], {plan[0].counter: used})
                    if stop is not None:
                        if stopped_tools is None:
                            stopped_tools = budget.tool_stops = set()
                        stopped_tools.add(tool)
                        stops = [(stop, True)]
        if not budget.stopped:
            stop = check_charges(plan[-1:], {"tool_calls": budget.tool_calls})
            if stop is None and limits.max_duration_s is not None:
                stop = check_duration(limits, elapsed, "step")
            if stop is not None:
                budget.stopped = True
                stops = [*(stops or ()), (stop, False)]
        return stops

    def _model(self, span: ReadableSpan, attrs: Mapping[str, Any], call: ModelCall) -> ReadableSpan:
        """Count one model call's step, tokens and cost; raise the flag at a limit."""
        limits = self._limits
        assert limits is not None
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
        cost = self._cost(attrs, call) if self._priced else None
        tid = span.context.trace_id
        now = self._clock()
        stop: Stop | None = None
        with self._lock:
            run = self._run_for(tid, now, watch=False)
            if call.call_id is not None and run.seen_call("\x00m" + call.call_id):
                self.stats.duplicate_model_calls += 1
                return span
            budget = self._budget_of(run, span)
            budget.see(span)
            budget.steps += 1
            budget.input_tokens += call.input_tokens
            budget.output_tokens += call.output_tokens
            if cost is not None:
                budget.cost_nusd += round(cost * NANO)
            elif self._priced:
                budget.unpriced += 1
            if not budget.stopped:
                counters = budget.counters()
                decision = check_before_step(limits, counters)
                if isinstance(decision, Stop):
                    stop = decision
                    budget.stopped = True
        if stop is None:
            return span
        annotations = self._budget_stopped(span, tid, run, [(stop, False)])
        return self._publish(span, [(BUDGET_SPAN_NAME, annotations)])

    def _cost(self, attrs: Mapping[str, Any], call: ModelCall) -> float | None:
        """The call's cost in USD: reported (``call.cost_usd`` or a cost attribute), else
        priced from the model and tokens; ``None`` when unknown (counted, logged once)."""
        if call.cost_usd is not None:
            return call.cost_usd
        for key in COST_ATTRIBUTES:
            value = attrs.get(key)
            if value is None:
                continue
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            ):
                return float(value)
            self.stats.usage_errors += 1
            self._log_once("cost", "a model span has an unusable cost attribute %s; ignored", key)
            break
        model = call.model
        prices = self._prices
        price: float | None = None
        if model is not None and prices is not None:
            try:
                price = prices(model, call.provider, call.input_tokens, call.output_tokens)
            except Exception as exc:
                # The agent-facing boundary (a price table is third-party code on the span's
                # thread): a failing lookup leaves the call unpriced, counted, logged once.
                self.stats.usage_errors += 1
                self._log_once(
                    "price_error", "pricing model %r failed (%r); its calls are not counted", model,
                    exc,
                )
                price = None
            else:
                if price is not None and (
                    isinstance(price, bool)
                    or not isinstance(price, (int, float))
                    or not math.isfinite(price)
                    or price < 0
                ):
                    self.stats.usage_errors += 1
                    self._log_once("price_value", "the price of %r is unusable: %r", model, price)
                    price = None
        if price is None:
            self.stats.unpriced_calls += 1
            key = model or "<no model name>"
            unpriced = self._unpriced_models
            if key not in unpriced and len(unpriced) < 64:
                unpriced.add(key)
                logger.warning(
                    "no price for model %r: its calls add nothing to the cost and max_cost_usd "
                    "cannot stop on them (CostNotFoundWarning; report a cost attribute such as "
                    "operation.cost, or check the model name against genai-prices)",
                    key,
                )
        return price

    def _budget_stopped(
        self, span: ReadableSpan, tid: int, run: _Run, stops: list[tuple[Stop, bool]]
    ) -> dict[str, str | int | float]:
        """Raise the flags of ``stops``, call ``on_budget``; return the span annotations."""
        budget = run.budget
        assert budget is not None
        counters = budget.counters()
        annotations: dict[str, str | int | float] = {}
        for stop, tool_only in stops:
            self.stats.budget_stops += 1
            if tool_only:
                assert stop.tool is not None
                flag = self.flags.raise_tool_flag(tid, stop.tool, stop, counters=counters)
            else:
                flag = self.flags.raise_flag(tid, stop, counters=counters)
            flagged = flag.stop is stop
            # Stops come tool first, run last: the run's stop is the one annotated.
            annotations = {
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
                    counters=counters,
                    tool_only=tool_only,
                    flagged=flagged,
                )
                self._call_back(self._budget_callbacks, event, "on_budget")
        return annotations

    def _evict_idle(self, now: float) -> int:
        # Runs are kept in order of last activity, so the expired ones are at the front.
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

    # -- verdict changes -----------------------------------------------------------------------

    def _changed(
        self,
        span: ReadableSpan,
        tid: int,
        assessment: Assessment,
        previous: Assessment | None,
    ) -> dict[str, str | int | float]:
        """Raise the flag on ``stuck``, call ``on_verdict``; return the span annotations."""
        self.stats.verdict_changes += 1
        flagged = assessment.verdict is Verdict.STUCK
        if flagged:
            self.flags.raise_flag(tid, assessment)
            self.stats.flags_raised += 1
        if self._callbacks:
            change = VerdictChange(
                trace_id=f"{tid:032x}",
                span_id=f"{span.context.span_id:016x}",
                assessment=assessment,
                previous=previous.verdict if previous is not None else None,
                flagged=flagged,
            )
            self._call_back(self._callbacks, change, "on_verdict")
        return self._annotations(assessment)

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
            f"traces={len(self._runs)}/{self.max_traces} ttl={self.idle_ttl_s:g}s "
            f"policy={self.policy.version}"
            f"{' budgets' if self._limits is not None else ''}>"
        )


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
    """A :class:`~tripwire.otel.conventions.SpanView` of an SDK span, built cheaply.

    Why not :func:`~tripwire.otel.conventions.view_from_readable_span`: building the frozen
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
