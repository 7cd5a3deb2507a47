"""The fleet's detection: decoded spans in, run records, transitions and kills out.

:class:`Fleet` is what the OTLP receiver runs on every request. It holds a short reorder
buffer (spans of one trace arrive in several requests and out of order: each span waits up to
``reorder_s`` after it arrived and is then judged in start-time order with the others of its
trace), maps every span once (:func:`tripwire.spans.map_span`, the mapping the span
processor and replay use), feeds each trace's tool calls to the loop watcher and counts its
budget, and says what must happen:

- ``urgent``: what must be in the store before the request is acknowledged (verdict
  transitions, budget stops, the alerts they cause, the receipt of a run that ended);
- ``routine``: counters and the calls' timeline, written behind;
- ``kills``: the runs whose kill flag must go up (a verdict change to ``stuck``, a budget stop).

It does no I/O and reads no clock: the receiver hands the time in. Memory is bounded: at most
``max_traces`` traces (least recently active dropped first, their run recorded as ended by
idleness), each holding the watcher's ring, a few counters and at most
:data:`~tripwire.store.runs.MAX_CALLS_PER_RUN` unwritten timeline rows.
"""

from __future__ import annotations

import heapq
import json
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import msgspec

from tripwire.core.budget import (
    Limits,
    Stop,
)
from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.reasons import ArgsKind, StopReason, Verdict, stop_reason_for
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer, Signature
from tripwire.core.watch import Assessment
from tripwire.engine import (
    Boundary,
    BudgetStopped,
    Decision,
    Engine,
    ModelSpan,
    StillStuck,
    VerdictChanged,
)
from tripwire.prices import Pricer
from tripwire.spans import (
    MAPPING_VERSION,
    MappingStats,
    RunBoundary,
    SpanView,
    map_span,
)
from tripwire.spans.mapping import error_name
from tripwire.store.runs import MAX_CALLS_PER_RUN, MAX_RAW_CHARS, Batch, CallRow, RunRow, VerdictRow

__all__ = ["Fleet", "Kill", "Outcome", "Transition"]

_NO_LIMITS: Final = Limits()
QUIET_KEPT_S: Final = 86_400.0
"""How long the last row of a run that went quiet is kept, should the run come back."""
QUIET_KEPT_MAX: Final = 10_000
"""Rows of quiet runs kept at most (under 1 KB each: no receipt), the oldest dropped first."""


_T = TypeVar("_T")


class _Kept(OrderedDict[str, tuple[_T, float]]):
    """Trace ids kept with a value and the time they were kept, oldest first: at most ``cap``
    of them (the oldest dropped first), and none older than what :meth:`forget_before` is
    given. What the fleet remembers of the runs it ended (``in`` is a dict lookup: it is asked
    for every trace of every request)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def keep(self, tid: str, value: _T, at: float) -> None:
        self[tid] = (value, at)
        self.move_to_end(tid)
        while len(self) > self.cap:
            self.popitem(last=False)

    def take(self, tid: str) -> _T | None:
        """The value kept for ``tid``, forgotten; ``None`` if there is none."""
        kept = self.pop(tid, None)
        return None if kept is None else kept[0]

    def seen(self, tid: str, *, keep: bool) -> _T | None:
        """The value kept for ``tid`` (``None`` if there is none), forgotten unless ``keep``."""
        if keep:
            kept = self.get(tid)
            return None if kept is None else kept[0]
        return self.take(tid)

    def forget_before(self, limit: float) -> None:
        while self and next(iter(self.values()))[1] < limit:
            self.popitem(last=False)


class Kill(msgspec.Struct, frozen=True, kw_only=True):
    """A run whose kill flag must go up (a ``msgspec.Struct``: one is made at every repeated call
    of a stuck run, and a Struct is built four times faster than a frozen dataclass)."""

    trace_id: str
    reason: StopReason
    message: str
    """Names the tool and a digest prefix, never arguments."""
    assessment: Assessment | None = None
    """The ``stuck`` verdict that raised it, for a loop stop."""
    stop: Stop | None = None
    """The budget decision that raised it, for a budget stop."""
    again: bool = False
    """The run was already stuck and repeated itself: raise the flag again (if it was
    lowered), but no new transition, page or ``killed`` mark."""


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """A verdict change or a budget stop (for metrics and alerts)."""

    trace_id: str
    agent: str | None
    verdict: str
    previous: str | None
    rule: str | None
    stop_reason: str | None
    reason: str


@dataclass(slots=True)
class Outcome:
    """What one processing step produced (see the module docstring)."""

    urgent: Batch = field(default_factory=Batch)
    routine: Batch = field(default_factory=Batch)
    kills: list[Kill] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    judged_calls: int = 0
    ended_runs: list[RunRow] = field(default_factory=list)
    late_spans: int = 0
    """Spans of runs whose root span was judged already (see :attr:`Fleet.late_spans`)."""


EVENT: Final = 0
END: Final = 1


class Rec(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One entry of a trace's event log: what one span meant for its run (digests only).

    The in-memory fleet applies records as it makes them; the Redis-state fleet appends them
    to a shared log first, so that every receiver applies the same records in the same order.
    """

    kind: int = EVENT
    """``EVENT`` (a span) or ``END`` (the trace went idle: the run is over)."""
    root: bool = False
    """The span was the trace's root: the run ends with it."""
    start: float | None = None
    end: float | None = None
    failed: bool = False
    exception_type: str | None = None
    service: str | None = None
    tool: ToolCall | None = None
    """A tool call. ``key`` is its arguments' signature: a record that leaves the process (the
    Redis-state fleet's shared log) has the arguments dropped; in memory a record lives for
    one request, and copying every call to drop them would cost more than it holds."""
    key: str | None = None
    """The call's signature key, 32 hex."""
    args_kind: str | None = None
    raw: str | None = None
    """Raw arguments, clipped (only with ``store_raw``)."""
    model: ModelCall | None = None
    agent: str | None = None
    """A run boundary's agent name."""
    outer: bool | None = None
    """For a run boundary: True when it is the trace's outermost (no parent)."""
    idle: bool = False
    """For ``END``: the run ended by going quiet, not with its root span."""
    span: str | None = None
    """The span's id (16 hex): what tells a replayed span from a new one (see
    :meth:`~tripwire.serve.shared_state.RedisFleet._adopt_logged`)."""

    @property
    def start_s(self) -> float | None:
        return self.start

    @property
    def end_s(self) -> float | None:
        return self.end

    @property
    def status_error(self) -> bool:
        return self.failed


class _Trace:
    __slots__ = (
        "agent",
        "assessment",
        "budget_stop",
        "cost_at_stuck",
        "cost_nusd",
        "created_at",
        "dirty",
        "end_s",
        "first_stuck",
        "input_tokens",
        "last_seen",
        "output_tokens",
        "service",
        "start_s",
        "steps",
        "timeline",
        "tool_calls",
        "unpriced",
        "verdict",
    )

    def __init__(self, now: float) -> None:
        self.agent: str | None = None
        self.service: str | None = None
        self.created_at = now
        self.last_seen = now
        self.tool_calls = 0
        self.steps = 0
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_nusd = 0
        self.unpriced = 0
        self.verdict = Verdict.WORKING
        self.assessment: Assessment | None = None
        self.first_stuck: int | None = None
        self.cost_at_stuck: int | None = None
        self.budget_stop: StopReason | None = None
        self.timeline: list[CallRow] = []
        self.dirty = True
        self.start_s: float | None = None
        self.end_s: float | None = None


class Fleet:
    """Per-trace detection for a fleet of agents (see the module docstring).

    Args:
        policy: the loop policy (the same defaults as in process and in replay).
        limits: budgets per run (tool calls, per-tool caps, steps, tokens, cost).
        normalizer: the signature normalizer (use a keyed one for a fleet).
        reorder_s: how long a span waits for the earlier spans of its trace.
        max_traces: traces kept at once (least recently active dropped first).
        idle_ttl_s: a trace without a span for this long is ended (its receipt written).
        store_raw: keep raw tool arguments in the timeline (off by default: digests only).
        pricer: prices model calls without a reported cost.
    """

    def __init__(
        self,
        *,
        policy: LoopPolicy = DEFAULT_POLICY,
        limits: Limits = _NO_LIMITS,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
        reorder_s: float = 0.2,
        max_traces: int = 100_000,
        idle_ttl_s: float = 300.0,
        store_raw: bool = False,
        pricer: Pricer | None = None,
    ) -> None:
        self.policy = policy
        self.limits = limits
        self.normalizer = normalizer
        self.reorder_s = reorder_s
        self.max_traces = max_traces
        self.idle_ttl_s = idle_ttl_s
        self.store_raw = store_raw
        self.pricer = pricer if pricer is not None else Pricer(warn=False)
        self.stats = MappingStats()
        self._now = 0.0
        self.engine = Engine(
            policy,
            limits=limits if limits.has_limits() else None,
            normalizer=normalizer,
            clock=lambda: self._now,
            max_traces=max_traces,
            idle_ttl_s=idle_ttl_s,
            price=self.pricer.cost,
        )
        """The engine every entry point shares: loops, budgets, call-id dedupe and attempts."""
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._buffer: list[tuple[float, int, list[tuple[float, int, SpanView]]]] = []
        """(release time, arrival order, [(judging time, arrival order, span)…]): a heap of
        requests (the spans of one request share their release time)."""
        self._buffered = 0
        self._arrivals = 0
        """Spans received so far: the arrival order of the next one."""
        self._touched: dict[str, _Trace] = {}
        """The traces a processing step applied records to, in order of their last one (the
        order of ``_traces`` among them): only these can be dirty at its end."""
        self._resume: dict[str, RunRow] = {}
        """Run rows of runs still going when this receiver started (see :meth:`resume`)."""
        self._resume_until = 0.0
        self._ended: _Kept[None] = _Kept(max_traces)
        """Traces whose root span ended their run: for ``idle_ttl_s``, at most ``max_traces``
        of them (see :attr:`late_spans`)."""
        self.late_spans = 0
        """Spans that came after their run's root span was judged (more than ``reorder_s``
        late: an exporter in another process that sends later), left out. The run's receipt
        stands as written; applied, such a span would start the run afresh, from zero, and its
        end would write over the receipt a half-run's."""
        self._quiet: _Kept[RunRow] = _Kept(QUIET_KEPT_MAX)
        """Runs that ended by going quiet (no root span seen), with their last row and when: a
        run that was only waiting (for a person, a long job) and comes back goes on counting
        from that row, its calls numbered on, and its root span writes its real end. Kept for
        :data:`QUIET_KEPT_S`, at most :data:`QUIET_KEPT_MAX`."""
        self._operator: _Kept[tuple[str, str, float]] = _Kept(QUIET_KEPT_MAX)
        """Runs an operator killed (who, through what, when) that have not ended yet: their
        receipt says ``user_cancelled`` by that operator, however the agent wound up after the
        stop. Kept for ``idle_ttl_s`` after the kill, at most :data:`QUIET_KEPT_MAX`."""
        self._client: _Kept[tuple[dict[str, Any], str]] = _Kept(QUIET_KEPT_MAX)
        """Stop receipts agents posted (``POST /api/runs/{id}/receipt``) for runs still held,
        with their health: the run's end writes the agent's receipt, not the one the trace
        implies. Kept for ``idle_ttl_s``, at most :data:`QUIET_KEPT_MAX`."""

    def client_receipt(self, trace_id: str, receipt: dict[str, Any], health: str, at: float) -> bool:
        """An agent posted its run's stop receipt: when the run ends here, its row carries this
        receipt and ``health`` (the agent saw how its loop ended; the trace only shows that it
        did). Returns whether this fleet holds the run (else the caller writes the row)."""
        self._client.keep(trace_id, (receipt, health), at)
        return trace_id in self._traces

    def operator_killed(self, trace_id: str, *, actor: str, via: str, at: float) -> None:
        """An operator killed the run (its flag is going up): when it ends, its receipt says
        ``user_cancelled`` by ``actor`` (through ``via``, ``dashboard`` or ``api``) at ``at``.
        A run that ended already keeps the receipt it has."""
        if trace_id not in self._ended:
            self._operator.keep(trace_id, (actor, via, at), at)

    def resuming(self, trace_id: str) -> bool:
        """Whether ``trace_id`` will go on from a row given to :meth:`resume`."""
        return trace_id in self._resume

    def resume(self, rows: Iterable[RunRow], now: float) -> int:
        """Go on counting runs that an earlier receiver left ``running`` in the store.

        A receiver that restarted holds no state for the runs still going: at its next span such
        a run started afresh, and its row's counters and call rows were rewritten from zero
        (the calls written before the restart no longer counted). A trace that has a row here
        takes that row's counters (calls, steps, tokens, cost, first stuck call, agent, service,
        creation time) when its next span arrives, and its calls are numbered on from there
        (the spool replay leaves out the spans a row holds already). The loop window starts
        afresh. Only rows written within ``idle_ttl_s`` of ``now`` are kept (a run quiet for
        longer is over), at most ``max_traces``, and for ``idle_ttl_s`` only; returns how many.
        """
        kept = self._resume
        for row in rows:
            if len(kept) >= self.max_traces:
                break
            if row.status == "running" and row.trace_id not in self._traces and row.updated_at >= now - self.idle_ttl_s:
                kept[row.trace_id] = row
        self._resume_until = now + self.idle_ttl_s
        return len(kept)

    def remember_ended(self, rows: Iterable[RunRow], now: float) -> tuple[int, int]:
        """Take in the runs an earlier receiver ended, as if this one had ended them.

        A receiver that restarted remembers no ended run: a late span of a run whose root span
        ended before the restart would start it afresh, and a run that went quiet and comes
        back would count from zero. From the store's rows (newest first): a run whose receipt
        claims no end went quiet, and goes on from its row if it comes back within
        :data:`QUIET_KEPT_S` (at most :data:`QUIET_KEPT_MAX`); any other run ended within
        ``idle_ttl_s`` ended with its root span (or a stop), and its late spans are left out
        (at most ``max_traces``). A run that was stopped and then went quiet counts as ended.
        Returns how many of each were taken in: (quiet, ended).
        """
        quiet: list[tuple[float, str, RunRow]] = []
        ended: list[tuple[float, str]] = []
        for row in rows:
            tid = row.trace_id
            if row.status != "ended" or tid in self._traces or tid in self._quiet or tid in self._ended:
                continue
            claimed = row.receipt.get("end") if isinstance(row.receipt, dict) else None
            if claimed is None:
                if row.updated_at >= now - QUIET_KEPT_S and len(quiet) < QUIET_KEPT_MAX:
                    quiet.append((row.updated_at, tid, msgspec.structs.replace(row, receipt=None)))
            elif row.updated_at >= now - self.idle_ttl_s and len(ended) < self.max_traces:
                ended.append((row.updated_at, tid))
        for at, tid, kept in sorted(quiet, key=lambda q: q[0]):  # oldest first: dropped first
            self._quiet.keep(tid, kept, at)
        for at, tid in sorted(ended):
            self._ended.keep(tid, None, at)
        return len(quiet), len(ended)

    replaying: bool = False
    """True while the receiver replays its write-ahead spool at start-up (records the
    Redis-state fleet's shared logs already hold are then not appended twice)."""

    def __len__(self) -> int:
        return len(self._traces)

    @property
    def buffered(self) -> int:
        """Spans waiting in the reorder buffer."""
        return self._buffered

    def verdict(self, trace_id: str) -> Assessment | None:
        """The verdict in force for a trace still held, or ``None``."""
        trace = self._traces.get(trace_id)
        return trace.assessment if trace is not None else None

    # -- the entry points ---------------------------------------------------------------------

    def process(self, views: Iterable[SpanView], now: float, *, flush: bool = False) -> Outcome:
        """Buffer ``views`` and judge every span whose wait is over (all of them with ``flush``).

        Args:
            views: decoded spans (any order, any traces).
            now: the wall-clock time (Unix seconds).
            flush: release the whole buffer (shutdown, or ``reorder_s == 0``).
        """
        # Calls are judged in start-time order; a root span ends its run, so it goes in at its
        # end time, after every call that started before it ended. Arrival order breaks ties.
        n = self._arrivals
        items: list[tuple[float, int, SpanView]] = []
        append = items.append
        for view in views:
            at = view.end_s if view.parent_span_id is None else view.start_s
            append((at or 0.0, n, view))
            n += 1
        self._arrivals = n
        buffer = self._buffer
        if flush or self.reorder_s <= 0:
            due = items
            for _release, _n, group in buffer:
                due += group
            buffer.clear()
            self._buffered = 0
        else:
            if items:
                heapq.heappush(buffer, (now + self.reorder_s, items[0][1], items))
                self._buffered += len(items)
            due = []
            while buffer and buffer[0][0] <= now:
                group = heapq.heappop(buffer)[2]
                self._buffered -= len(group)
                due += group
        out = Outcome()
        if due:
            # Judged in that order (the reorder itself): (time, arrival) pairs are unique, so
            # the spans themselves are never compared.
            due.sort()
            records = self._records(due)
            if records:
                self._commit(records, now, out)
        self._end_idle(now, out)
        self._write_dirty(now, out)
        return out

    def drain(self, now: float) -> Outcome:
        """Judge everything in the reorder buffer now (graceful shutdown).

        Runs are not ended: their agents may still be going, and a receipt written now would
        claim an end nobody saw. Their rows stay ``running`` with the counters so far.
        """
        return self.process((), now, flush=True)

    # -- one span ----------------------------------------------------------------------------

    def _records(
        self, due: list[tuple[float, int, SpanView]]
    ) -> list[tuple[str, Rec, Signature | None]]:
        """The spans as records of their traces' event logs (digests only: no raw arguments
        unless ``store_raw``), each with its tool call's signature; spans that mean nothing for
        their run are left out."""
        normalizer = self.normalizer
        signature = normalizer.signature
        stats = self.stats
        store_raw = self.store_raw
        records: list[tuple[str, Rec, Signature | None]] = []
        append = records.append
        resource: object = None
        service: str | None = None
        for _at, _n, view in due:
            event = map_span(view, normalizer, stats)
            root = view.parent_span_id is None
            if event is None and not root:
                continue
            if view.resource_attributes is not resource:  # a request's spans share one
                resource = view.resource_attributes
                service = None
                if resource:
                    name = resource.get("service.name")
                    if type(name) is str and not name.startswith("unknown_service"):  # the SDK's "unnamed"
                        service = name[:200]
            exception_type = error_name(view.exception_type)
            sig: Signature | None = None
            tool: ToolCall | None = None
            key: str | None = None
            kind: str | None = None
            raw: str | None = None
            if isinstance(event, ToolCall):
                tool = event  # arguments and all: see Rec.tool
                sig = signature(event.tool, event.arguments)
                key = sig.key.to_bytes(16, "big").hex()  # f"{:032x}", in half the time
                kind = sig.kind._value_
                if store_raw:
                    raw = _raw(event.arguments)
            rec = Rec(  # the call's fields in the one call: a third less than setting them after
                root=root,
                start=view.start_s,
                end=view.end_s,
                failed=view.status_error,
                exception_type=exception_type,
                service=service,
                span=view.span_id or None,
                tool=tool,
                key=key,
                args_kind=kind,
                raw=raw,
            )
            if isinstance(event, ModelCall):
                rec.model = event
            elif isinstance(event, RunBoundary):
                rec.agent = event.agent[:200] if event.agent else None
                rec.outer = event.parent_span_id is None
            append((view.trace_id, rec, sig))
        return records

    def _commit(
        self, records: list[tuple[str, Rec, Signature | None]], now: float, out: Outcome
    ) -> None:
        """Apply records (the Redis-state fleet first appends them to the shared log).

        Traces are independent, so each trace's records are applied together, in their order,
        with the trace looked up once per run of tool calls and those fed to the engine as one
        batch; the state reached (the fleet's and the engine's recency orders included) is the
        one record-by-record application reaches. Only the order of the outcome's entries of
        different traces differs. Records go one by one when the interleaving could matter:
        when the fleet or the engine may have to evict a trace to make room, or when a trace
        of the request has an engine run past its idle TTL (whether another trace's new run
        sweeps it first decides the verdict its next transition says it came from).
        """
        groups = self._by_trace(records)
        room = self.max_traces - len(groups)
        engine = self.engine
        one_by_one = len(self._traces) > room or len(engine) > room
        if not one_by_one:
            last_active = engine.last_active
            expired = now - self.idle_ttl_s
            for tid in groups:
                last = last_active(tid)
                if last is not None and last < expired:
                    one_by_one = True
                    break
        apply = self._apply_all
        if one_by_one:
            for item in records:
                apply(item[0], [item], now, out)
            return
        mixed = False
        for tid, items in groups.items():
            apply(tid, items, now, out)
            if not mixed:
                for item in items:
                    if item[1].tool is None:
                        mixed = True
                        break
        if mixed:
            # The groups went in the order of the engine's last sight of each trace (see
            # _by_trace); the fleet's own recency order counts every record that touched a
            # trace: put the traces still held back in that order.
            order: dict[str, None] = {}
            pop = order.pop
            for tid, rec, _sig in records:
                if rec.tool is not None or rec.model is not None or rec.outer is not None:
                    pop(tid, None)
                    order[tid] = None
            traces = self._traces
            move = traces.move_to_end
            for tid in order:
                if tid in traces:
                    move(tid)

    def _by_trace(
        self, records: list[tuple[str, Rec, Signature | None]]
    ) -> dict[str, list[tuple[str, Rec, Signature | None]]]:
        """Each trace's records in order, the traces in the order of their last record the
        engine sees (a tool call, or with limits a model call): applied in that order, the
        engine's runs end up in the order one-by-one application leaves them in."""
        metered = self.engine.limits is not None and self.engine.limits.has_limits()
        groups: dict[str, list[tuple[str, Rec, Signature | None]]] = {}
        pop = groups.pop
        get = groups.get
        for item in records:
            tid = item[0]
            rec = item[1]
            if rec.tool is not None or (metered and rec.model is not None):
                group = pop(tid, None)
                if group is not None:
                    group.append(item)
                    groups[tid] = group
                    continue
            else:
                group = get(tid)
                if group is not None:
                    group.append(item)
                    continue
            groups[tid] = [item]
        return groups

    def _apply_all(
        self, tid: str, items: list[tuple[str, Rec, Signature | None]], now: float, out: Outcome
    ) -> None:
        """Apply one trace's records in order: each run of plain tool calls (no root) in one
        step, anything else one by one. Records of a run its root span ended are left out."""
        n = len(items)
        i = 0
        ended = self._ended
        while i < n:
            if tid in ended:
                self._late(n - i, out)
                return
            rec = items[i][1]
            if rec.tool is None or rec.root:
                self._apply(tid, rec, now, out, items[i][2])
                i += 1
                continue
            j = i + 1
            while j < n and (nxt := items[j][1]).tool is not None and not nxt.root:
                j += 1
            trace = self._trace(tid, now, out)
            self._tools(trace, tid, items[i:j] if i or j < n else items, now, out)
            i = j

    def _apply(
        self, tid: str, rec: Rec, now: float, out: Outcome, sig: Signature | None = None
    ) -> None:
        """Apply one record; ``sig`` is its tool call's signature when this process made it
        (else it is rebuilt from the record's key)."""
        if rec.kind == END:
            if tid in self._traces:
                self._end(tid, now, out, idle=rec.idle, root=rec if not rec.idle else None)
            return
        if rec.tool is None and rec.model is None and rec.outer is None:
            # A root span that maps to nothing: it only ends the run.
            if rec.root and (tid in self._traces or tid in self._resume or tid in self._quiet):
                if tid not in self._traces:
                    self._trace(tid, now, out)  # a run an earlier receiver left running
                self._end(tid, now, out, idle=False, root=rec)
            return
        trace = self._trace(tid, now, out)
        if rec.tool is not None:
            self._tools(trace, tid, [(tid, rec, sig)], now, out)
            if rec.root:
                self._end(tid, now, out, idle=False, root=rec)
            return
        if rec.service and trace.service is None:
            trace.service = rec.service
        _widen(trace, rec)
        if rec.model is not None:
            self._model(trace, tid, rec.model, now, out)
        elif rec.outer is not None:
            if rec.agent and (trace.agent is None or rec.outer):
                trace.agent = rec.agent
            if not rec.outer and not rec.root:
                self._now = now
                self.engine.observe(Boundary(trace_id=tid, root=False, agent=rec.agent))
            trace.dirty = True
        if rec.root:
            self._end(tid, now, out, idle=False, root=rec)

    def _late(self, n: int, out: Outcome) -> None:
        self.late_spans += n
        out.late_spans += n

    def _trace(self, tid: str, now: float, out: Outcome) -> _Trace:
        traces = self._traces
        trace = traces.get(tid)
        if trace is None:
            trace = traces[tid] = _Trace(now)
            if self._resume or self._quiet:
                row = self._resume.pop(tid, None)
                quiet = self._quiet.take(tid)
                if quiet is not None:
                    row = quiet  # newer than a row an earlier receiver left
                if row is not None:
                    _continue(trace, row)
            while len(traces) > self.max_traces:
                self._evict(next(iter(traces)), now, out)
        else:
            trace.last_seen = now
            traces.move_to_end(tid)
        touched = self._touched
        touched.pop(tid, None)  # last touch last, as in _traces
        touched[tid] = trace
        return trace

    def _evict(self, tid: str, now: float, out: Outcome) -> None:
        """Make room: the least recently active trace's run is recorded as ended (idle)."""
        self._end(tid, now, out, idle=True)

    def _tools(
        self,
        trace: _Trace,
        tid: str,
        items: list[tuple[str, Rec, Signature | None]],
        now: float,
        out: Outcome,
    ) -> None:
        """Apply consecutive tool-call records of one trace, the calls judged as one batch; each
        signature is the one this process made, or is rebuilt from its record's key.

        The trace's service and time span take in each record before that record's decisions
        are acted on (the run rows they write are snapshots), the rest at the end."""
        calls: list[ToolCall] = []
        sigs: list[Signature] = []
        for _tid, rec, sig in items:
            call = rec.tool
            assert call is not None
            if sig is None:
                assert rec.key is not None and rec.args_kind is not None
                sig = Signature(call.tool, int(rec.key, 16), ArgsKind(rec.args_kind))
            calls.append(call)
            sigs.append(sig)
        engine = self.engine
        previous = engine.verdict(tid)
        self._now = now
        after: list[Assessment | bool | None] = []
        found = engine.observe_calls(tid, calls, sigs, verdicts=after)
        k = 0
        at = found[0][0] if found else -1
        timeline = trace.timeline
        # The timeline keeps a run's last calls: of a batch longer than it holds, only the tail
        # is recorded (a Collector that sends a whole long trace at once, tail sampling).
        recorded_from = len(after) - MAX_CALLS_PER_RUN
        index = first = trace.tool_calls
        absorbed = 0
        assessment: Assessment | None = None
        for i, verdict in enumerate(after):
            if verdict is False:
                continue  # a second report of one execution (the engine counts each call once)
            assert verdict is not True
            assessment = verdict
            index += 1
            if i == at:
                _absorb(trace, items, absorbed, i + 1)
                absorbed = i + 1
                trace.tool_calls = index
                trace.assessment = assessment
                k = self._decide(trace, tid, found, k, previous, now, out)
                at = found[k][0] if k < len(found) else -1
            previous = assessment
            if i >= recorded_from:
                call = calls[i]
                rec = items[i][1]
                timeline.append(
                    CallRow(  # by position (see CallRow), in its fields' order
                        tid,
                        index,
                        call.tool[:200],
                        rec.key,  # digest: 32 hex
                        call.result_digest[:32] if call.result_digest else None,
                        call.error_type[:100] if call.error_type else None,
                        call.attempt,
                        call.progress[:100] if call.progress else None,
                        call.lease.owner[:200] if call.lease is not None else None,
                        call.start_s,
                        call.end_s,
                        assessment.verdict._value_ if assessment is not None else None,
                        rec.raw,
                    )
                )
        if len(timeline) > MAX_CALLS_PER_RUN:
            del timeline[: len(timeline) - MAX_CALLS_PER_RUN]
        _absorb(trace, items, absorbed, len(items))
        if index != first:
            trace.tool_calls = index
            trace.assessment = assessment
            out.judged_calls += index - first
            trace.dirty = True

    def _decide(
        self,
        trace: _Trace,
        tid: str,
        found: list[tuple[int, Decision]],
        k: int,
        previous: Assessment | None,
        now: float,
        out: Outcome,
    ) -> int:
        """Act on the decisions one call of a batch brought: ``found[k]`` and those after it of
        the same call (``found`` is in call order); the position of the next call's."""
        at = found[k][0]
        end = len(found)
        while k < end and found[k][0] == at:
            decision = found[k][1]
            k += 1
            if isinstance(decision, VerdictChanged):
                self._transition(trace, tid, decision.assessment, previous, now, out)
            elif isinstance(decision, StillStuck):
                # It repeated after it was judged stuck: its flag goes up again if someone
                # lowered it (nudge, then kill), without a new transition or page.
                assessment = decision.assessment
                out.kills.append(
                    Kill(
                        trace_id=tid,
                        reason=stop_reason_for(assessment.rule),
                        message=assessment.reason,
                        assessment=assessment,
                        again=True,
                    )
                )
            elif isinstance(decision, BudgetStopped) and not decision.tool_only:
                self._budget(trace, tid, decision.stop, now, out)
        return k

    def _model(self, trace: _Trace, tid: str, call: ModelCall, now: float, out: Outcome) -> None:
        # The run record's counters (what the dashboard and the report show), priced always;
        # budget decisions are the engine's meter's.
        trace.steps += 1
        trace.input_tokens += call.input_tokens
        trace.output_tokens += call.output_tokens
        cost = call.cost_usd
        if cost is None:
            cost = self.pricer.cost(
                call.model, call.provider, call.input_tokens, call.output_tokens,
                why_it_matters="runs with this model show no cost",
            )
        if cost is None:
            trace.unpriced += 1
        else:
            trace.cost_nusd += round(cost * 1e9)
        trace.dirty = True
        self._now = now
        priced = msgspec.structs.replace(call, cost_usd=cost) if cost is not None else call
        for decision in self.engine.observe(ModelSpan(trace_id=tid, call=priced)):
            if isinstance(decision, BudgetStopped) and not decision.tool_only:
                self._budget(trace, tid, decision.stop, now, out)

    # -- decisions ---------------------------------------------------------------------------

    def _transition(
        self,
        trace: _Trace,
        tid: str,
        a: Assessment,
        previous: Assessment | None,
        now: float,
        out: Outcome,
    ) -> None:
        trace.verdict = a.verdict
        stuck = a.verdict is Verdict.STUCK
        if stuck and trace.first_stuck is None:
            trace.first_stuck = a.call_index
            trace.cost_at_stuck = trace.cost_nusd
        out.urgent.verdicts.append(
            VerdictRow(
                trace_id=tid,
                at=now,
                verdict=a.verdict.value,
                previous=previous.verdict.value if previous is not None else None,
                rule=a.rule.value if a.rule is not None else None,
                tool=(a.tool or "")[:200] or None,
                digest=(a.digest or "")[:16] or None,
                call_index=a.call_index,
                hits=a.hits,
                reason=a.reason,
                policy_version=a.policy_version,
                normalizer_version=a.normalizer_version,
            )
        )
        out.transitions.append(
            Transition(
                trace_id=tid,
                agent=trace.agent,
                verdict=a.verdict.value,
                previous=previous.verdict.value if previous is not None else None,
                rule=a.rule.value if a.rule is not None else None,
                stop_reason=None,
                reason=a.reason,
            )
        )
        if stuck:
            reason = stop_reason_for(a.rule)
            out.kills.append(Kill(trace_id=tid, reason=reason, message=a.reason, assessment=a))
        out.urgent.runs.append(self._row(tid, trace, now))

    def _budget(self, trace: _Trace, tid: str, stop: Stop, now: float, out: Outcome) -> None:
        reason, message = stop.reason, stop.message
        trace.budget_stop = reason
        out.urgent.verdicts.append(
            VerdictRow(
                trace_id=tid,
                at=now,
                verdict=trace.verdict.value,
                call_index=trace.tool_calls,
                reason=message,
                stop_reason=reason.value,
                policy_version=self.policy.version,
                normalizer_version=self.normalizer.version,
            )
        )
        out.transitions.append(
            Transition(
                trace_id=tid,
                agent=trace.agent,
                verdict=trace.verdict.value,
                previous=trace.verdict.value,
                rule=None,
                stop_reason=reason.value,
                reason=message,
            )
        )
        out.kills.append(Kill(trace_id=tid, reason=reason, message=message, stop=stop))
        out.urgent.runs.append(self._row(tid, trace, now))

    def _end_idle(self, now: float, out: Outcome) -> None:
        if self._resume and now > self._resume_until:
            self._resume.clear()  # the runs that did not come back within the idle TTL are over
        limit = now - self.idle_ttl_s
        self._forget(now)
        traces = self._traces
        while traces:
            tid, trace = next(iter(traces.items()))
            if trace.last_seen >= limit:
                break
            self._end(tid, now, out, idle=True)

    def _end(
        self, tid: str, now: float, out: Outcome, *, idle: bool, root: Rec | None = None
    ) -> None:
        trace = self._traces.pop(tid, None)
        self.engine.end(tid)
        if trace is None:
            return
        if root is not None:
            _widen(trace, root)
            self._ended.keep(tid, None, now)
        row = self._row(tid, trace, now)
        row.status = "ended"
        row.ended_at = now
        from tripwire.serve.receipts import receipt_for

        receipt, health = receipt_for(
            row, trace.assessment, trace.budget_stop, root=root, idle=idle,
            policy=self.policy, normalizer=self.normalizer, operator=self._operator.seen(tid, keep=idle),
        )
        posted = self._client.seen(tid, keep=idle and root is None)
        if posted is not None:
            receipt, health = posted
        row.receipt = receipt
        row.health = health
        if row.stop_reason is None:
            row.stop_reason = receipt.get("reason")
        if idle and root is None:
            self._quiet.keep(tid, msgspec.structs.replace(row, receipt=None), now)  # the counters, not the receipt
        out.urgent.runs.append(row)
        if trace.timeline:
            out.urgent.calls.extend(trace.timeline)
            trace.timeline = []
        out.ended_runs.append(row)

    def _forget(self, now: float) -> None:
        """Forget the ended runs past their windows (``idle_ttl_s``, :data:`QUIET_KEPT_S`)."""
        self._ended.forget_before(now - self.idle_ttl_s)
        self._operator.forget_before(now - self.idle_ttl_s)
        self._client.forget_before(now - self.idle_ttl_s)
        self._quiet.forget_before(now - QUIET_KEPT_S)

    def _write_dirty(self, now: float, out: Outcome) -> None:
        # An urgent row of a run still going was made mid-batch: bring it up to date, so the
        # store never keeps the counters of the call that changed the verdict as the last word.
        urgent = out.urgent.runs
        for i, row in enumerate(urgent):
            trace = self._traces.get(row.trace_id)
            if trace is not None and row.status == "running":
                urgent[i] = self._row(row.trace_id, trace, now)
        written = {r.trace_id for r in urgent}
        # Only a trace a record was applied to can be dirty: not a walk over every trace held.
        traces = self._traces
        touched = self._touched
        for tid, trace in touched.items():
            if trace.dirty and traces.get(tid) is trace:
                trace.dirty = False
                if tid not in written:
                    out.routine.runs.append(self._row(tid, trace, now))
                if trace.timeline:
                    out.routine.calls.extend(trace.timeline)
                    trace.timeline = []
        touched.clear()

    def _row(self, tid: str, trace: _Trace, now: float) -> RunRow:
        a = trace.assessment
        duration = None
        if trace.start_s is not None and trace.end_s is not None:
            duration = max(trace.end_s - trace.start_s, 0.0)
        cost = trace.cost_nusd / 1e9 if (trace.cost_nusd or not trace.unpriced) else None
        after = 0
        cost_after = None
        if trace.first_stuck is not None:
            after = max(trace.tool_calls - trace.first_stuck, 0)
            if trace.cost_at_stuck is not None:
                cost_after = (trace.cost_nusd - trace.cost_at_stuck) / 1e9
        return RunRow(  # by position (see RunRow), in its fields' order
            tid,
            trace.agent or trace.service,  # named from the first span: service.name until a span names the agent
            trace.service,
            "running",  # status
            trace.verdict._value_,  # ._value_: .value is a property, 7x slower
            a.rule._value_ if a is not None and a.rule is not None else None,
            (  # stop_reason
                trace.budget_stop._value_
                if trace.budget_stop is not None
                else (stop_reason_for(a.rule)._value_ if a is not None and a.verdict is Verdict.STUCK else None)
            ),
            None,  # health
            trace.steps,
            trace.tool_calls,
            trace.input_tokens,
            trace.output_tokens,
            cost,
            duration,
            trace.first_stuck,
            after,  # calls_after_stuck
            cost_after,
            False,  # killed
            False,  # acknowledged
            False,  # resolved
            self.policy.version,
            self.normalizer.version,
            MAPPING_VERSION,
            None,  # receipt
            trace.created_at,
            now,  # updated_at
        )


def _continue(trace: _Trace, row: RunRow) -> None:
    """``trace`` goes on from ``row``, the run's row an earlier receiver wrote (see
    :meth:`Fleet.resume`)."""
    trace.agent = row.agent
    trace.service = row.service
    trace.created_at = row.created_at or trace.created_at
    trace.tool_calls = row.tool_calls
    trace.steps = row.steps
    trace.input_tokens = row.input_tokens
    trace.output_tokens = row.output_tokens
    if row.cost_usd is not None:
        trace.cost_nusd = round(row.cost_usd * 1e9)
    elif row.steps:
        trace.unpriced = 1  # its cost was unknown: it stays unknown
    trace.first_stuck = row.first_stuck_call
    if row.first_stuck_call is not None and row.cost_after_stuck is not None:
        trace.cost_at_stuck = trace.cost_nusd - round(row.cost_after_stuck * 1e9)


def _absorb(trace: _Trace, items: list[tuple[str, Rec, Signature | None]], lo: int, hi: int) -> None:
    """``_widen`` and the first service name, for the records ``items[lo:hi]`` in turn."""
    if lo >= hi:
        return
    service = trace.service
    start = trace.start_s
    end = trace.end_s
    for k in range(lo, hi):
        rec = items[k][1]
        if service is None and rec.service:
            service = rec.service
        at = rec.start
        if at is not None and (start is None or at < start):
            start = at
        at = rec.end
        if at is not None and (end is None or at > end):
            end = at
    trace.service = service
    trace.start_s = start
    trace.end_s = end


def _widen(trace: _Trace, view: Rec) -> None:
    if view.start is not None and (trace.start_s is None or view.start < trace.start_s):
        trace.start_s = view.start
    if view.end is not None and (trace.end_s is None or view.end > trace.end_s):
        trace.end_s = view.end


def _raw(arguments: object) -> str | None:
    if isinstance(arguments, str):
        return arguments[:MAX_RAW_CHARS]
    if isinstance(arguments, (dict, list)):
        try:
            return json.dumps(arguments, default=str)[:MAX_RAW_CHARS]
        except (TypeError, ValueError, RecursionError):
            return None
    return None

