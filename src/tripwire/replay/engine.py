"""Replay: run a loop policy over recorded traces, one result per trace, no model calls.

Two steps, so that many policies can be replayed over one parse (``tripwire calibrate``):

1. :func:`load_traces` reads OTLP files (or takes :class:`~tripwire.spans.SpanView`
   objects), maps every span with the shared mapping
   (:func:`tripwire.spans.map_span`, the same one the span processor uses), groups
   the tool calls by trace across files and ``resourceSpans``, drops duplicate reports of one
   span or one call, orders them by start time and computes each call's signature once.
   The result, a list of :class:`TraceCalls`, does not depend on the policy.
2. :func:`replay_trace` feeds one trace's calls to the engine the span processor runs
   (:class:`tripwire.engine.Engine`) under a policy and reports where the verdict first became
   ``stuck`` and what it was at the end. Partial reports of one call (same call id) count
   once; a report of a call id whose earlier report ended in error is the next attempt.

:func:`replay_traces` does both. Everything here is deterministic: files are read in sorted
order, ties in start time keep input order, and nothing reads a clock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from tripwire.core.events import ToolCall
from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer, Signature
from tripwire.engine import Engine, VerdictChanged
from tripwire.errors import ConfigError
from tripwire.replay.reader import (
    DEFAULT_MAX_FILE_BYTES,
    STDIN,
    FileBatch,
    Problem,
    expand_paths,
    read_batches,
    read_files,
)
from tripwire.spans import MAPPING_VERSION, MappingStats, RunBoundary, SpanView, map_span
from tripwire.spans.otlp import DecodedSpan

__all__ = [
    "PARALLEL_MIN_BYTES",
    "FirstTrip",
    "Loaded",
    "Replayed",
    "TraceCalls",
    "TraceResult",
    "load_traces",
    "replay_all",
    "replay_trace",
    "replay_traces",
]

_VIEWS_SOURCE: Final = "<spans>"
_NO_CALLS_REASON: Final = "the trace has no tool calls"
_SIGNED_MEMO: Final = 65_536
"""Signatures remembered by tool and argument text while traces are loaded (then forgotten)."""


def _NO_CLOCK() -> float:
    return 0.0


@dataclass(frozen=True, slots=True)
class FirstTrip:
    """The call at which a trace's verdict first became ``stuck``."""

    call_index: int
    """1-based index among the trace's tool calls (in start-time order)."""
    tool: str
    """The tool of that call."""
    rule: Rule
    """The rule that tripped."""
    period: int | None
    """Cycle length (1 for a repetition)."""
    hits: int
    """How many times the repeated unit occurred."""
    digest: str | None
    """The call's signature digest (show a prefix; never the arguments)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``first_trip`` object of ``replay --json``)."""
        return {
            "call_index": self.call_index,
            "tool": self.tool,
            "rule": self.rule.value,
            "period": self.period,
            "hits": self.hits,
            "digest": self.digest,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceResult:
    """What a policy made of one recorded trace."""

    trace_id: str
    """32 lowercase hex characters."""
    agent: str | None
    """The agent name from the trace's outermost run span, if there is one."""
    tool_calls: int
    """Tool calls in the trace (after dropping duplicate reports of one call)."""
    verdict: Verdict
    """The verdict in force after the last call (``working`` for a trace without calls)."""
    first_trip: FirstTrip | None
    """Where the verdict first became ``stuck``; ``None`` if it never did."""
    calls_after_trip: int
    """Tool calls after the first trip (what stopping there would have saved); 0 without one."""
    arguments_seen: bool
    """False when no tool call of the trace recorded arguments (signatures are name-only)."""
    reason: str
    """Why the final verdict (one sentence, no arguments)."""
    policy_version: str
    normalizer_version: str
    mapping_version: str = MAPPING_VERSION
    sources: tuple[str, ...] = ()
    """The files the trace's spans came from (not part of the JSON output)."""

    def to_json(self) -> dict[str, Any]:
        """The ``replay --json`` object for this trace."""
        return {
            "trace_id": self.trace_id,
            "agent": self.agent,
            "tool_calls": self.tool_calls,
            "verdict": self.verdict.value,
            "first_trip": self.first_trip.to_json() if self.first_trip is not None else None,
            "calls_after_trip": self.calls_after_trip,
            "arguments_seen": self.arguments_seen,
            "reason": self.reason,
            "policy_version": self.policy_version,
            "normalizer_version": self.normalizer_version,
            "mapping_version": self.mapping_version,
        }


@dataclass(frozen=True, slots=True)
class TraceCalls:
    """One trace's tool calls, ordered and signed: everything a replay needs, policy-free."""

    trace_id: str
    agent: str | None
    calls: tuple[ToolCall, ...]
    """The tool calls in start-time order."""
    signatures: tuple[Signature, ...]
    """``signatures[i]`` is the signature of ``calls[i]`` under :attr:`normalizer`."""
    normalizer: Normalizer
    """The normalizer the signatures and result digests were made with."""
    sources: tuple[str, ...] = ()
    """The files the spans came from, in reading order."""

    @property
    def arguments_seen(self) -> bool:
        """True when at least one call recorded arguments."""
        return any(not s.name_only for s in self.signatures)


@dataclass(slots=True)
class Loaded:
    """The result of :func:`load_traces`."""

    traces: list[TraceCalls] = field(default_factory=list)
    """One entry per trace, in order of first appearance in the input."""
    problems: list[Problem] = field(default_factory=list)
    """What could not be read (the rest was)."""
    stats: MappingStats = field(default_factory=MappingStats)
    """How the spans mapped (tool, model, run, other, malformed)."""
    files: int = 0
    """Inputs read."""
    spans: int = 0
    """Spans read."""
    duplicates: int = 0
    """Span reports dropped as duplicates (same span id, or same tool call id, twice)."""


class _Builder:
    """Accumulates one trace's events while the input is read."""

    __slots__ = ("boundaries", "by_call_id", "calls", "sources", "span_ids")

    def __init__(self) -> None:
        self.calls: list[tuple[float, int, ToolCall]] = []
        self.by_call_id: dict[str, int] = {}
        self.boundaries: list[tuple[float, int, RunBoundary]] = []
        self.span_ids: set[str] = set()
        self.sources: list[str] = []


def _start_key(start: float | None) -> float:
    return start if start is not None else float("inf")


class _Collector:
    def __init__(self, normalizer: Normalizer) -> None:
        self.normalizer = normalizer
        self.builders: dict[str, _Builder] = {}
        self.loaded = Loaded()
        self.seq = 0

    def add(self, view: SpanView, source: str) -> None:
        self.add_views((view,), source)

    def add_views(self, views: Iterable[SpanView], source: str) -> None:
        loaded = self.loaded
        builders = self.builders
        normalizer = self.normalizer
        stats = loaded.stats
        seq = self.seq
        spans = 0
        inf = float("inf")
        for view in views:
            spans += 1
            builder = builders.get(view.trace_id)
            if builder is None:
                builder = builders[view.trace_id] = _Builder()
            sources = builder.sources
            if (not sources or sources[-1] != source) and source not in sources:
                sources.append(source)
            span_id = view.span_id
            if span_id:
                if span_id in builder.span_ids:
                    loaded.duplicates += 1  # the same span exported twice (a retried export)
                    continue
                builder.span_ids.add(span_id)
            event = map_span(view, normalizer, stats)
            seq += 1
            if type(event) is ToolCall:  # map_span makes exactly these types
                start = event.start_s
                entry = (start if start is not None else inf, seq, event)
                call_id = event.call_id
                if call_id is not None:
                    at = builder.by_call_id.get(call_id)
                    if at is not None and builder.calls[at][2].error_type is not None:
                        at = None  # the earlier execution failed: this span is the next attempt
                    if at is not None:
                        # Partial/streamed reports of one call count once: keep the earliest
                        # start, and the report that ended last (it is the most complete).
                        loaded.duplicates += 1
                        old_key, old_seq, old = builder.calls[at]
                        if (event.end_s or 0.0) >= (old.end_s or 0.0):
                            builder.calls[at] = (min(old_key, entry[0]), old_seq, event)
                        continue
                    builder.by_call_id[call_id] = len(builder.calls)
                builder.calls.append(entry)
            elif type(event) is RunBoundary:
                builder.boundaries.append((_start_key(event.start_s), seq, event))
        self.seq = seq
        loaded.spans += spans

    def add_batch(self, batch: FileBatch) -> None:
        self.loaded.files += 1
        self.loaded.problems.extend(batch.problems)
        self.add_views(batch.spans, batch.source)

    def finish(self) -> Loaded:
        normalizer = self.normalizer
        signature = normalizer.signature
        # Agents repeat calls (a loop is nothing else): a call whose tool and argument text were
        # signed already takes that signature (a pure function of the two), not a new one.
        signed: dict[tuple[str, str], Signature] = {}
        for trace_id, b in self.builders.items():
            b.calls.sort()  # by (start, seq): seq is unique, so the calls are never compared
            calls = tuple(e[2] for e in b.calls)
            sigs: list[Signature] = []
            for c in calls:
                args = c.arguments
                if type(args) is not str:
                    sigs.append(signature(c.tool, args))
                    continue
                key = (c.tool, args)
                sig = signed.get(key)
                if sig is None:
                    if len(signed) >= _SIGNED_MEMO:
                        signed.clear()
                    sig = signed[key] = signature(c.tool, args)
                sigs.append(sig)
            self.loaded.traces.append(
                TraceCalls(
                    trace_id=trace_id,
                    agent=_agent(b.boundaries),
                    calls=calls,
                    signatures=tuple(sigs),
                    normalizer=normalizer,
                    sources=tuple(b.sources),
                )
            )
        self.builders = {}
        return self.loaded


def _agent(boundaries: list[tuple[float, int, RunBoundary]]) -> str | None:
    """The agent name of the outermost run boundary (a root, or one whose parent is no run)."""
    if not boundaries:
        return None
    if len(boundaries) == 1:  # what the general case gives for one boundary
        return boundaries[0][2].agent or None
    ids = {b.span_id for _, _, b in boundaries}
    ordered = sorted(boundaries, key=lambda e: (e[0], e[1]))
    outer = [b for _, _, b in ordered if b.parent_span_id is None or b.parent_span_id not in ids]
    for b in outer + [b for _, _, b in ordered]:
        if b.agent:
            return b.agent
    return None


Source = Iterable["str | os.PathLike[str] | SpanView"]
"""Paths (files, directories, ``-``) and/or spans."""


def load_traces(
    source: str | os.PathLike[str] | Source,
    normalizer: Normalizer = DEFAULT_NORMALIZER,
    *,
    on_file: Callable[[str, int], None] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Loaded:
    """Read and map every span, and group the tool calls by trace.

    Args:
        source: a path, or an iterable of paths (files, directories walked recursively, ``-``
            for standard input) and/or :class:`~tripwire.spans.SpanView` objects.
        normalizer: signs the calls and digests their results; every later replay of these
            traces uses it.
        on_file: called with ``(path, size)`` before each file is read (progress).
        max_file_bytes: the most one file may take, on disk and decompressed (see the reader).

    Returns:
        The traces in order of first appearance, the problems met, and mapping counters.
    """
    collector = _Collector(normalizer)
    items: Iterable[Any] = [source] if isinstance(source, (str, os.PathLike)) else source
    pending: list[str | os.PathLike[str]] = []
    for item in items:
        if isinstance(item, (SpanView, DecodedSpan)):
            if pending:
                for batch in read_batches(pending, on_file=on_file, max_file_bytes=max_file_bytes):
                    collector.add_batch(batch)
                pending = []
            collector.add(item, _VIEWS_SOURCE)  # type: ignore[arg-type]  # a DecodedSpan reads as one
        else:
            pending.append(item)
    for batch in read_batches(pending, on_file=on_file, max_file_bytes=max_file_bytes):
        collector.add_batch(batch)
    return collector.finish()


def replay_trace(trace: TraceCalls, policy: LoopPolicy) -> TraceResult:
    """Run ``policy`` over one trace's calls, from a fresh state.

    ``first_trip`` is the first call at which the verdict became ``stuck``; ``verdict`` is the
    verdict in force after the last call (a stuck verdict holds until a whole window passes
    without a rule tripping, so a trace that kept looping ends ``stuck``).
    """
    normalizer = trace.normalizer
    calls = trace.calls
    n = len(calls)
    if n == 0:
        return TraceResult(
            trace_id=trace.trace_id,
            agent=trace.agent,
            tool_calls=0,
            verdict=Verdict.WORKING,
            first_trip=None,
            calls_after_trip=0,
            arguments_seen=False,
            reason=_NO_CALLS_REASON,
            policy_version=policy.version,
            normalizer_version=normalizer.version,
            sources=trace.sources,
        )
    # The engine the span processor and the OTLP receiver run, fed the trace's calls in order
    # with their signatures (computed once by load_traces); no clock: nothing is ever idle.
    engine = Engine(policy, normalizer=normalizer, clock=_NO_CLOCK)
    tid = trace.trace_id
    first: FirstTrip | None = None
    for i, decision in engine.observe_calls(tid, calls, trace.signatures):
        if type(decision) is VerdictChanged and decision.stuck:
            changed = decision.assessment
            if changed.rule is not None:
                first = FirstTrip(
                    call_index=changed.call_index,
                    tool=changed.tool or calls[i].tool,
                    rule=changed.rule,
                    period=changed.period,
                    hits=changed.hits,
                    digest=changed.digest,
                )
                break
    current = engine.verdict(tid)
    return TraceResult(
        trace_id=trace.trace_id,
        agent=trace.agent,
        tool_calls=n,
        verdict=current.verdict if current is not None else Verdict.WORKING,
        first_trip=first,
        calls_after_trip=n - first.call_index if first is not None else 0,
        arguments_seen=trace.arguments_seen,
        reason=current.reason if current is not None else _NO_CALLS_REASON,
        policy_version=policy.version,
        normalizer_version=normalizer.version,
        sources=trace.sources,
    )


def replay_traces(
    source: str | os.PathLike[str] | Source,
    policy: LoopPolicy | None = None,
    normalizer: Normalizer | None = None,
    *,
    skip_empty: bool = False,
    problems: list[Problem] | None = None,
    workers: int = 1,
) -> Iterator[TraceResult]:
    """Replay ``policy`` over every trace in ``source``: one :class:`TraceResult` per trace.

    Args:
        source: a path, or an iterable of paths (files, directories, ``-``) and/or
            :class:`~tripwire.spans.SpanView` objects.
        policy: the loop policy (default: ``LoopPolicy()``).
        normalizer: the signature normalizer (default: the default normalizer).
        skip_empty: leave out traces without any tool call (by default they are reported
            with ``tool_calls == 0`` and verdict ``working``).
        problems: a list to collect input problems in; without one (``None``), the first
            problem (a missing path, a file that is not OTLP…) is raised as
            :class:`~tripwire.errors.InputError` instead of passing silently.
        workers: processes to replay in (see :func:`replay_all`); the results do not depend
            on it.

    All input is read before the first result (a trace's spans may be spread over several
    files); results come in order of the traces' first appearance.
    """
    if workers != 1:
        replayed = replay_all(source, policy, normalizer, skip_empty=skip_empty, workers=workers)
        _report(replayed.problems, problems)
        yield from replayed.results
        return
    loaded = load_traces(source, normalizer or DEFAULT_NORMALIZER)
    _report(loaded.problems, problems)
    pol = policy if policy is not None else LoopPolicy()
    for trace in loaded.traces:
        if skip_empty and not trace.calls:
            continue
        yield replay_trace(trace, pol)


def _report(found: list[Problem], problems: list[Problem] | None) -> None:
    if problems is not None:
        problems.extend(found)
        return
    first = next((p for p in found if not p.skipped), None)
    if first is not None:
        raise first.to_error()


@dataclass(frozen=True, slots=True, kw_only=True)
class Replayed:
    """What :func:`replay_all` gives: one result per trace, and what the input held."""

    results: list[TraceResult]
    """One per trace, in order of first appearance (without the empty ones under
    ``skip_empty``)."""
    traces: int
    """Traces in the input, with or without tool calls."""
    files: int
    """Inputs read."""
    spans: int
    """Spans read."""
    duplicates: int
    """Span reports dropped as duplicates (same span id, or same tool call id, twice)."""
    problems: list[Problem]
    """What could not be read (the rest was)."""
    stats: MappingStats
    """How the spans mapped."""
    workers: int
    """Processes the traces were replayed in (1: this one alone)."""


PARALLEL_MIN_BYTES: Final = 16 * 1024 * 1024
"""Below this much input on disk (about 20,000 GenAI tool spans of OTLP/JSON), ``workers=0``
replays in this process alone: starting another one would cost more than it saves."""
_MAX_AUTO_WORKERS: Final = 4

_log = logging.getLogger("tripwire.replay")


@dataclass(frozen=True, slots=True)
class _Job:
    """What every process of a parallel replay starts from (inherited through ``fork``)."""

    files: list[tuple[str, bool]]
    """The input files, as :func:`~tripwire.replay.reader.expand_paths` found them."""
    first: FileBatch
    """The first file, read before the others started (they share it as it is in memory)."""
    policy: LoopPolicy
    normalizer: Normalizer
    max_file_bytes: int
    processes: int


@dataclass(frozen=True, slots=True)
class _Share:
    """What one process of a parallel replay found: its traces' results and its counts."""

    results: list[TraceResult]
    traces: int
    """Traces in the whole input (every process reads all of it: they must agree)."""
    spans: int
    """Spans in the whole input (likewise)."""
    order: int
    """A hash of the trace ids in order of first appearance (likewise)."""
    own_spans: int
    duplicates: int
    stats: MappingStats
    files: int
    problems: list[Problem]


_JOB: _Job | None = None
"""The job forked workers inherit (never pickled: only a share's number goes to a worker, and
its results come back)."""


def replay_all(
    source: str | os.PathLike[str] | Source,
    policy: LoopPolicy | None = None,
    normalizer: Normalizer | None = None,
    *,
    skip_empty: bool = False,
    on_file: Callable[[str, int], None] | None = None,
    on_replayed: Callable[[int, int], None] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    workers: int = 1,
) -> Replayed:
    """Read ``source`` and replay ``policy`` over every trace, in up to ``workers`` processes.

    With more than one process (on Linux, where ``fork`` starts them cheaply), this process
    reads the first file, then starts the others, which find it in memory as it is; every
    process reads the other files itself, keeps every ``n``-th trace in order of first
    appearance, and maps, signs and replays those. Nothing large is copied between them: only
    the results come back. The results are the same whatever ``workers`` is, in the same order.
    Standard input and :class:`~tripwire.spans.SpanView` objects are replayed in this process
    alone. Should a worker die (killed, out of memory) or the processes read different input
    (a file changed meanwhile), everything is replayed again here alone, with a warning logged.

    Args:
        source, policy, normalizer, skip_empty: as for :func:`replay_traces`.
        on_file, max_file_bytes: as for :func:`load_traces` (``on_file`` is called by this
            process only).
        on_replayed: called with ``(traces replayed, traces in all)`` as the replay goes on,
            every :data:`_PROGRESS_EVERY` traces and at the end (progress; with several
            processes, an estimate from this one's share until the end).
        workers: processes to use, this one included; 0 picks one per CPU (at most 4) when the
            files take at least :data:`PARALLEL_MIN_BYTES` on disk, else 1.

    Raises:
        ConfigError: ``workers`` is negative.
    """
    if workers < 0:
        raise ConfigError("workers", workers, "0 (one per CPU) or a number of processes")
    norm = normalizer or DEFAULT_NORMALIZER
    pol = policy if policy is not None else LoopPolicy()
    if not isinstance(source, (str, os.PathLike)):
        source = list(source)  # looked through here, then read: a generator would be spent
    files = _files_only(source)
    processes = _processes(workers, files) if files else 1
    if files and processes > 1:
        (first,) = read_files(files[:1], on_file=on_file, max_file_bytes=max_file_bytes)
        job = _Job(files, first, pol, norm, max_file_bytes, processes)
        replayed = _replay_forked(job, on_file, on_replayed, skip_empty)
        if replayed is not None:
            return replayed
        on_file = None  # the files were read once already: no second progress run
    loaded = load_traces(source, norm, on_file=on_file, max_file_bytes=max_file_bytes)
    traces = [t for t in loaded.traces if not (skip_empty and not t.calls)]
    return Replayed(
        results=_replay_each(traces, pol, on_replayed, 1, len(traces)),
        traces=len(loaded.traces),
        files=loaded.files,
        spans=loaded.spans,
        duplicates=loaded.duplicates,
        problems=loaded.problems,
        stats=loaded.stats,
        workers=1,
    )


_PROGRESS_EVERY: Final = 1000


def _replay_each(
    traces: list[TraceCalls],
    policy: LoopPolicy,
    on_replayed: Callable[[int, int], None] | None,
    scale: int,
    total: int,
) -> list[TraceResult]:
    """``replay_trace`` of each trace; progress as ``scale`` times the traces done here."""
    if on_replayed is None:
        return [replay_trace(t, policy) for t in traces]
    results: list[TraceResult] = []
    for i, trace in enumerate(traces, start=1):
        results.append(replay_trace(trace, policy))
        if not i % _PROGRESS_EVERY:
            on_replayed(min(total, i * scale), total)
    on_replayed(min(total, len(results) * scale), total)
    return results


def _files_only(source: str | os.PathLike[str] | Source) -> list[tuple[str, bool]] | None:
    """The input files of ``source``, or ``None`` when it holds spans or standard input."""
    paths: list[str | os.PathLike[str]] = []
    for item in [source] if isinstance(source, (str, os.PathLike)) else source:
        if not isinstance(item, (str, os.PathLike)):
            return None
        paths.append(item)
    files = list(expand_paths(paths))
    if any(path == STDIN for path, _ in files):
        return None
    return files


def _processes(workers: int, files: list[tuple[str, bool]]) -> int:
    if not sys.platform.startswith("linux"):
        return 1  # no fork: a spawned worker would start from nothing
    if workers:
        return workers
    size = 0
    for path, _ in files:
        with contextlib.suppress(OSError):  # reported when it is read
            size += os.path.getsize(path)
    if size < PARALLEL_MIN_BYTES:
        return 1
    return min(_MAX_AUTO_WORKERS, len(os.sched_getaffinity(0)))


def _replay_share(
    share: int,
    on_file: Callable[[str, int], None] | None = None,
    on_replayed: Callable[[int, int], None] | None = None,
) -> _Share:
    """Read all of :data:`_JOB`'s input; replay its traces number ``share``, ``share + n``…

    Traces are numbered in order of first appearance, which every process sees alike.
    """
    job = _JOB
    assert job is not None  # set by _replay_forked before any worker starts
    n = job.processes
    collector = _Collector(job.normalizer)
    order: dict[str, int] = {}
    spans = 0
    rest = read_files(job.files[1:], on_file=on_file, max_file_bytes=job.max_file_bytes)
    for batch in itertools.chain((job.first,), rest):
        views = batch.spans
        spans += len(views)
        mine: list[SpanView] = []
        for view in views:
            tid = view.trace_id
            number = order.get(tid)
            if number is None:
                number = order[tid] = len(order)
            if number % n == share:
                mine.append(view)
        collector.add_batch(FileBatch(batch.source, mine, batch.problems))
        del batch, views, mine  # one file's spans at a time
    loaded = collector.finish()
    return _Share(
        results=_replay_each(loaded.traces, job.policy, on_replayed, n, len(order)),
        traces=len(order),
        spans=spans,
        order=hash(tuple(order)),  # str hashes agree: the workers are forks of this process
        own_spans=loaded.spans,
        duplicates=loaded.duplicates,
        stats=loaded.stats,
        files=loaded.files,
        problems=loaded.problems,
    )


def _worker(share: int, send: Any) -> None:
    """A forked process's whole life: its share's result, or why there is none, to ``send``."""
    try:
        result: _Share | str = _replay_share(share)
    except BaseException as exc:  # anything at all: the parent says it and replays alone
        result = f"{type(exc).__name__}: {exc}"
    with contextlib.suppress(OSError):  # the parent stopped listening (interrupted): nothing to say
        send.send(result)
        send.close()


def _replay_forked(
    job: _Job,
    on_file: Callable[[str, int], None] | None,
    on_replayed: Callable[[int, int], None] | None,
    skip_empty: bool,
) -> Replayed | None:
    """Share 0 here, each other share in a forked process of its own; ``None`` when one of
    them gave no result (see :func:`replay_all`)."""
    import multiprocessing

    global _JOB
    _JOB = job
    n = job.processes
    context = multiprocessing.get_context("fork")
    workers: list[tuple[Any, Any]] = []
    try:
        for k in range(1, n):  # (multiprocessing flushes stdout and stderr before each fork)
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_worker, args=(k, send), daemon=True)
            process.start()
            send.close()
            workers.append((process, receive))
        shares = [_replay_share(0, on_file, on_replayed)]
        for _process, receive in workers:
            share = receive.recv()  # EOFError when the worker died before it sent anything
            if not isinstance(share, _Share):
                raise ChildProcessError(share)
            shares.append(share)
    except (OSError, EOFError, ChildProcessError) as exc:
        # A worker was killed (out of memory, a signal), could not start, or failed.
        why = "it ended without a result" if isinstance(exc, EOFError) else str(exc) or type(exc).__name__
        _log.warning("replay: a worker process failed (%s); replaying in this process alone", why)
        return None
    finally:
        _JOB = None
        for process, receive in workers:
            receive.close()
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    first = shares[0]
    if any((s.traces, s.spans, s.order) != (first.traces, first.spans, first.order) for s in shares):
        _log.warning("replay: the input changed while it was read; replaying in this process alone")
        return None
    results: list[TraceResult] = [None] * first.traces  # type: ignore[list-item]  # all filled below
    stats = MappingStats()
    for k, share in enumerate(shares):
        results[k::n] = share.results
        for name in MappingStats.__slots__:
            setattr(stats, name, getattr(stats, name) + getattr(share.stats, name))
    if on_replayed is not None:
        on_replayed(first.traces, first.traces)
    return Replayed(
        results=[r for r in results if r.tool_calls] if skip_empty else results,
        traces=first.traces,
        files=first.files,
        spans=sum(s.own_spans for s in shares),
        duplicates=sum(s.duplicates for s in shares),
        problems=first.problems,
        stats=stats,
        workers=n,
    )
