"""The ASGI app of ``tripwire serve``: the OTLP/HTTP receiver, the runs API, metrics, health.

Endpoints (every one but ``/healthz`` needs ``Authorization: Bearer <token>`` unless the
service runs with ``--no-auth``):

- ``POST /v1/traces``: OTLP/HTTP, ``application/x-protobuf`` or ``application/json``, gzip or
  not. 200 with an ``ExportTraceServiceResponse`` (a partial success names how many spans were
  rejected and why), 400 for a malformed payload, 413 over ``max_body_bytes``, 415 for another
  content type, 503 with ``Retry-After`` when the receiver is saturated (OTLP exporters retry
  those), 401 without a valid token.
- ``GET /api/runs?verdict=&agent=&stop_reason=&health=&status=&since=&limit=&offset=`` (a value
  no run can hold is a 400 naming the parameter),
  ``GET /api/runs/{trace_id}`` (the run, its verdict history, its calls, its receipt),
  ``POST /api/runs/{trace_id}/kill`` | ``/resolve`` | ``/acknowledge``.
- ``GET /api/flags/{trace_id}`` and ``POST /api/flags`` (``{"trace_ids": [...]}``): the kill
  flags agents poll when there is no Redis; ``POST /api/flags/wait`` (``{"trace_ids": [...],
  "flagged": [...], "timeout_s": 20}``): the same, answered as soon as one of them goes up or
  down (a long poll).
- ``GET /metrics`` (Prometheus), ``GET /healthz`` (alive), ``GET /readyz`` (store and Redis
  reachable).

Processing: a request is decoded and judged on the event loop (pure CPU, no I/O), then what
must not be lost (verdict transitions, budget stops, alerts, receipts of ended runs) is written
to the store and the kill flags are raised, then the request is appended to the write-ahead
spool (:mod:`tripwire.serve.spool`), all *before* the 200 goes out; counters and the calls'
timeline are written behind by one writer thread within ``flush_s``. A SIGKILL therefore loses
nothing acknowledged: the next start replays the spool. Writes the store refuses are kept and
retried (export requests get 503 meanwhile); kill flags the channel refuses are raised again
every tick. docs/serve.md, "What a crash can lose", has the measured figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import hmac
import itertools
import json
import logging
import math
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import xxhash
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tripwire.core.budget import Limits
from tripwire.core.health import HealthState
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.reasons import StopReason, Verdict
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError, InputError
from tripwire.serve.alerts import Alerts, AlertTarget, Sender
from tripwire.serve.fleet import QUIET_KEPT_MAX, QUIET_KEPT_S, Fleet, Kill, Outcome
from tripwire.serve.killchannel import (
    ACTIONS,
    FlagWatch,
    KillChannel,
    RedisKillChannel,
    StoreKillChannel,
    TooManyWaiters,
    flag_payload,
)
from tripwire.serve.metrics import Metrics
from tripwire.serve.otlp import BodyTooLarge, decode_request, decompress
from tripwire.serve.spool import Spool, SpoolBusy
from tripwire.serve.websecurity import SESSION_COOKIE, LoginThrottle, SecurityHeaders, Sessions
from tripwire.store.runs import MAX_OFFSET, MAX_PAGE, Batch, FlagRow, RunRow, RunStore

__all__ = ["GC_YOUNG", "ServeConfig", "Service", "create_app", "tune_gc"]

GC_YOUNG: Final = 50_000
"""Allocations between two collections of the youngest generation in ``tripwire serve``
(Python's default is 700)."""


def tune_gc() -> None:
    """The garbage collector's settings of the ``tripwire serve`` process (its own, so set once
    by the command, not by :func:`create_app`): what start-up made (modules, the app, the
    store's engine) is frozen, never scanned again, and the youngest generation is collected
    every :data:`GC_YOUNG` allocations instead of every 700. A request of 512 spans makes
    thousands of short-lived containers, nearly all freed by their reference counts; at the
    default, the collector ran several times per request and took 5-15% of the receiver's
    time (``bench/bench_serve.py``). What it still collects (cycles) waits a little longer.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, middle, old)

logger = logging.getLogger("tripwire.serve")

_PROTOBUF: Final = "application/x-protobuf"
_JSON: Final = "application/json"
_FLAGS_UP_MAX: Final = 100_000
"""Flags raised in the store that a receiver remembers as up (the oldest forgotten first)."""
RECENT_REQUESTS: Final = 4096
"""Digests of the latest export requests a receiver applied (16 bytes each, in memory), so that
an exporter's retry of one (its answer timed out or was lost) is acknowledged, not counted twice.
With ``--state redis`` the digests are Redis keys shared by every receiver instead."""
REQUEST_PREFIX: Final = "tripwire:request:"
WAIT_DEFAULT_S: Final = 20.0
"""How long ``POST /api/flags/wait`` holds a request when nothing changes (by default)."""
WAIT_MAX_S: Final = 60.0
WAIT_RECHECK_S: Final = 2.0
"""A waiting request reads its flags again this often even when nothing woke it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """Everything ``tripwire serve`` is configured with (see ``tripwire serve --help``)."""

    store_url: str | None = None
    """The run store (``sqlite:///…`` or ``postgresql://…``); default the user's SQLite file."""
    redis_url: str | None = None
    """Redis for the kill channel (and, with ``state="redis"``, per-trace state)."""
    state: str = "memory"
    """Where per-trace state lives: ``memory`` (route spans by trace id to one receiver) or
    ``redis`` (stateless receivers behind any load balancer; needs ``redis_url``)."""
    tokens: tuple[str, ...] = ()
    """Accepted bearer tokens; empty with ``auth=False`` only."""
    token_names: tuple[str, ...] = ()
    """The name of each token, in the same order (``token 1``, ``token 2``… for those without
    one): an operator's Kill records who acted by the name of the token they used."""
    auth: bool = True
    """Require a token on every endpoint but ``/healthz``."""
    policy: LoopPolicy = DEFAULT_POLICY
    limits: Limits = field(default_factory=Limits)
    normalizer: Normalizer = DEFAULT_NORMALIZER
    fleet_key: bool = True
    """When ``normalizer`` has no digest key (none configured): key every signature and digest
    the service stores with the fleet's own key, made on first start and kept in the run store
    (so every receiver of one store, and every restart, uses the same one). Unkeyed digests of
    short secrets can be reversed by guessing: a 6-digit PIN in a tool argument was recovered
    from its digest in 0.6 s. ``False``: unkeyed digests, comparable with an unkeyed
    ``tripwire replay`` of the same traces."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body accepted, before and after decompression (413 above)."""
    max_inflight: int = 4
    """Requests processed at once; more get 503 with Retry-After. Decoding and judging run on
    the event loop one request at a time, so more in flight only adds latency (the overload
    bench: with 16, answers took so long that 128 client connections were all waiting). A
    request counts only once its body is in: uploads that stall cannot hold these slots."""
    body_timeout_s: float = 30.0
    """The most time an export request's body may take to arrive (after its head); a slower
    one gets 408 and its connection is closed."""
    header_timeout_s: float = 10.0
    """The most time a client may take to send a request's head, from connecting or from its
    previous answer (closed, unanswered, past it: see :mod:`tripwire.serve.connections`)."""
    max_buffered_spans: int = 200_000
    """Spans waiting in the reorder buffer at most; more get 503 with Retry-After."""
    reorder_s: float = 0.2
    """How long a span waits for the earlier spans of its trace."""
    flush_s: float = 0.25
    """How often routine writes (counters, timelines) go to the store."""
    idle_ttl_s: float = 300.0
    """A trace quiet this long is ended (its receipt written as "went idle")."""
    max_traces: int = 100_000
    flag_ttl_s: float = 3600.0
    store_raw: bool = False
    """Keep raw tool arguments in the calls' timeline (off: digests only)."""
    alerts: tuple[AlertTarget, ...] = ()
    dashboard_url: str | None = None
    """The public URL of the dashboard, for links in alerts."""
    dashboard: bool = True
    """Serve the dashboard (``/``, ``/runs``, ``/runs/{trace_id}``) behind the same auth."""
    spool_dir: str | None = None
    """The write-ahead spool (:mod:`tripwire.serve.spool`): every accepted request is appended
    there before its 200 and replayed at the next start after a crash; ``None``: off."""
    spool_max_bytes: int = 1024 * 1024 * 1024
    """The spool at most; above (the store is far behind), requests get 503 with Retry-After."""
    max_pending_writes: int = 256
    """Routine write batches waiting for the writer at most; more: 503 with Retry-After."""


class Service:
    """One receiver: the fleet detector, the store, the kill channel, alerts and metrics."""

    def __init__(
        self,
        config: ServeConfig,
        *,
        store: RunStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.store = store if store is not None else RunStore.open(config.store_url)
        self.metrics = Metrics()
        normalizer = config.normalizer
        if normalizer.key is None and config.fleet_key:
            normalizer = dataclasses.replace(normalizer, key=self.store.fleet_key(clock()))
        self.normalizer = normalizer
        """The normalizer the service signs and digests with (keyed by the fleet's key unless
        one was configured, or ``fleet_key`` is off)."""
        options: dict[str, Any] = {
            "policy": config.policy,
            "limits": config.limits,
            "normalizer": normalizer,
            "reorder_s": config.reorder_s,
            "max_traces": config.max_traces,
            "idle_ttl_s": config.idle_ttl_s,
            "store_raw": config.store_raw,
        }
        if config.state == "redis":
            if not config.redis_url:
                raise ConfigError("--redis", None, "a Redis URL when --state is redis (the state is kept there)")
            import redis

            from tripwire.serve.shared_state import RedisFleet

            client = redis.Redis.from_url(config.redis_url, socket_timeout=5, socket_connect_timeout=2)
            self.fleet: Fleet = RedisFleet(client, **options)
        elif config.state == "memory":
            self.fleet = Fleet(**options)
        else:
            raise ConfigError("--state", config.state, "'memory' or 'redis'")
        self.flag_watch = FlagWatch()
        """Wakes the agents waiting in ``POST /api/flags/wait`` when a flag goes up or down."""
        self.kill: KillChannel = (
            RedisKillChannel.from_url(config.redis_url, watch=self.flag_watch)
            if config.redis_url
            else StoreKillChannel(self.store, watch=self.flag_watch)
        )
        self._flags_in_store = isinstance(self.kill, StoreKillChannel) and self.kill.store is self.store
        """The flags are rows of this store: they go up with the transitions (see _commit)."""
        self._flags_up: OrderedDict[str, float] = OrderedDict()
        """The flags this receiver raised in the store, and when each expires (forgotten when an
        operator lowers one through this receiver)."""
        self.alerts = Alerts(config.alerts, dashboard_url=config.dashboard_url)
        self.sender = Sender(self.store, config.alerts)
        self.inflight = 0
        self._routine: queue.Queue[Batch | float | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="tripwire-writer", daemon=True)
        self._writer_started = False
        self._closed = False
        self._fleet_lock = threading.Lock()
        self.started = threading.Event()
        """Set once :meth:`start` is done: until then export requests get 503 (the service
        listens at once after a restart, and resumes the runs left running meanwhile)."""
        self.start_failed: BaseException | None = None
        self.sessions = Sessions()
        """The dashboard's sign-in sessions (see :mod:`tripwire.serve.websecurity`)."""
        self.login_throttle = LoginThrottle()
        self._warned: set[str] = set()
        self.unwritten: list[Outcome] = []
        """Outcomes whose urgent writes failed (the store is down): retried every tick; while
        there are any, export requests get 503 (the exporters retry them)."""
        self.pending_kills: list[dict[str, Any]] = []
        """Kill flags the channel refused (Redis down): raised again every tick."""
        self._applying: dict[int, float] = {}
        self._apply_ids = itertools.count()
        self.watermark = 0.0
        """Every span accepted before this time is judged and its writes are in the store."""
        self._write_backlog = False
        self._recent: OrderedDict[bytes, None] = OrderedDict()
        self._redis_requests: Any = getattr(self.fleet, "client", None)  # Redis state: its client
        self.spool: Spool | None = None
        if config.spool_dir is not None:
            try:
                self.spool = Spool(config.spool_dir, max_bytes=config.spool_max_bytes)
            except SpoolBusy as exc:
                raise ConfigError("--spool", config.spool_dir, "a spool directory no other receiver uses",
                                  message=str(exc)) from None
            except OSError as exc:
                raise ConfigError("--spool", config.spool_dir, "a writable directory",
                                  message=f"--spool {config.spool_dir}: {exc.strerror or exc}") from None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Go on counting the runs an earlier receiver left running, replay what a crashed
        one left in the spool, then start the writer."""
        written: dict[str, float] = {}
        if not self._writer_started and self._redis_requests is None:
            written = self._resume_runs()
            self._remember_ended_runs()
        if self.spool is not None and not self._writer_started:
            self._replay(written)
        if not self._writer_started:
            self._writer_started = True
            self._writer.start()

    def _replay(self, written: dict[str, float]) -> None:
        self.fleet.replaying = True
        try:
            self._replay_pending(written)
        finally:
            self.fleet.replaying = False

    def _read_runs(self, at_most: int, **filters: Any) -> list[RunRow]:
        """Up to about ``at_most`` rows of the store's runs matching ``filters``, newest first,
        a page at a time (start-up reads; the store's errors propagate)."""
        rows: list[RunRow] = []
        while len(rows) < at_most:
            page, total = self.store.runs(**filters, limit=MAX_PAGE, offset=len(rows))
            rows += page
            if not page or len(rows) >= total:
                break
        return rows

    def _remember_ended_runs(self) -> None:
        """In-memory state: the runs that ended lately, before a restart, are known as ended
        (see :meth:`Fleet.remember_ended`). A store that does not answer: they are not (logged
        once)."""
        now = self.clock()
        try:
            rows = self._read_runs(
                QUIET_KEPT_MAX + min(self.fleet.max_traces, 10 * MAX_PAGE),
                status="ended", since=now - QUIET_KEPT_S,
            )
        except Exception as exc:  # the boundary of a start-up nicety: never fatal
            self._log_once("ended:" + type(exc).__name__, "cannot read the runs that ended lately: %r", exc)
            return
        quiet, ended = self.fleet.remember_ended(rows, now)
        if quiet or ended:
            logger.info("%d runs that went quiet and %d that ended lately, before this start, are known", quiet, ended)

    def _resume_runs(self) -> dict[str, float]:
        """In-memory state: the runs the store says are still going (an earlier receiver's,
        before a restart) go on counting from their rows at their next span (see
        :meth:`Fleet.resume`). Returns, per run, until when its row holds what the spool says
        (requests accepted up to then: the spool replay leaves their spans of the run out).
        A store that does not answer: the runs start afresh, as before (logged once)."""
        try:
            rows = self._read_runs(self.fleet.max_traces, status="running")
        except Exception as exc:  # the boundary of a start-up nicety: never fatal
            self._log_once("resume:" + type(exc).__name__, "cannot read the runs still going: %r", exc)
            return {}
        kept = self.fleet.resume(rows, self.clock())
        if kept:
            logger.warning("%d runs an earlier receiver left running go on counting from their rows", kept)
        # A row written at time t holds every span of its run accepted up to t - reorder_s (the
        # spans that waited in the reorder buffer were judged by t).
        return {
            row.trace_id: row.updated_at - self.config.reorder_s
            for row in rows
            if self.fleet.resuming(row.trace_id)
        }

    def _ended_rows(self, views: Sequence[Any], written: dict[str, float], looked_up: set[str]) -> None:
        """Add to ``written`` the runs of ``views`` that the store says ended: a spooled span
        accepted up to a row's time minus the reorder wait is in that row already (replayed,
        it would start the run afresh and rewrite the ended row with fewer calls)."""
        new = {v.trace_id for v in views} - looked_up
        if not new:
            return
        looked_up |= new
        try:
            rows = self.store.runs_of(new)
        except Exception as exc:  # the store is down: replayed as before (logged once)
            self._log_once("replay-rows:" + type(exc).__name__, "cannot read the runs of the spool: %r", exc)
            return
        for row in rows:
            if row.status == "ended":
                written[row.trace_id] = row.updated_at - self.config.reorder_s

    def _replay_pending(self, written: dict[str, float]) -> None:
        assert self.spool is not None
        requests = spans = skipped = 0
        written = dict(written)
        looked_up: set[str] = set(written)
        started = time.perf_counter()
        for entry in self.spool.pending():
            try:
                data = decompress(entry.body, entry.encoding, max_bytes=self.config.max_body_bytes)
                decoded = decode_request(data, entry.kind)
            except InputError as exc:  # it was accepted once, so this is a damaged segment
                self._log_once("replay:" + type(exc).__name__, "spooled request unreadable, skipped: %s", exc)
                continue
            requests += 1
            views = decoded.views
            self._ended_rows(views, written, looked_up)
            if written:
                # Spans whose runs' rows hold them already (written before the crash: runs
                # going on from those rows, and runs that ended): not counted again.
                views = [v for v in views if entry.at > written.get(v.trace_id, -1.0)]
                skipped += len(decoded.views) - len(views)
            spans += len(views)
            self._remember_request(request_key(data, entry.kind))  # a retry of it is a duplicate
            out = self.process(views, self.clock(), flush=True)
            try:
                self._apply_urgent(out)
            except Exception as exc:  # the store is down: kept in self.unwritten, retried
                self._log_once("urgent:" + type(exc).__name__, "run store unavailable: %r", exc)
        if requests:
            logger.warning(
                "replayed %d spooled requests (%d spans) that a previous receiver accepted "
                "before it stopped without writing them (%.2f s)",
                requests, spans, time.perf_counter() - started,
            )
        if skipped:
            logger.warning("%d spooled spans were in their runs' rows already: not counted again", skipped)
        # Deleted once the watermark passes now: everything replayed is then in the store.
        self.spool.adopt_pending(self.clock())

    def close(self) -> None:
        """Judge what is buffered, write everything, stop the writer (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._retry_unwritten()
        with self._fleet_lock:
            out = self.fleet.drain(self.clock())
        try:
            self._apply_urgent(out)
        except Exception as exc:
            self._log_once("urgent:" + type(exc).__name__, "run store unavailable at shutdown: %r", exc)
        if self._writer_started:
            self._routine.put(self.clock())
            self._routine.put(None)
            self._writer.join(timeout=10)
        elif out.routine:
            with contextlib.suppress(Exception):
                self.store.write(out.routine)
        if self.spool is not None:
            # Everything accepted is in the store only when nothing failed: then the spool is
            # emptied; else it stays for the next start to replay.
            clean = not self.unwritten and not self._writer.is_alive() and not self._write_backlog
            self.spool.close(empty=clean)

    def _write_loop(self) -> None:
        carry: Batch | None = None
        mark: float | None = None
        stop = False
        while not stop:
            try:
                item = self._routine.get(timeout=0.5 if carry is not None else None)
            except queue.Empty:
                item = 0.0  # nothing new: retry the carried batch
            items = [item]
            with contextlib.suppress(queue.Empty):
                while len(items) < 10_000:
                    items.append(self._routine.get_nowait())
            for it in items:
                if it is None:
                    stop = True
                elif isinstance(it, float):
                    if it:
                        mark = it if mark is None else max(mark, it)
                elif carry is None:
                    carry = it
                else:
                    carry.runs.extend(it.runs)
                    carry.calls.extend(it.calls)
                    carry.flags.extend(it.flags)
            if carry is not None:
                if self._write_routine(carry):
                    carry = None
                elif stop:
                    self._write_backlog = True
                    return  # shutting down with the store down: the spool keeps the requests
            self._write_backlog = carry is not None
            if carry is None and mark is not None:
                self.watermark = max(self.watermark, mark)
                mark = None

    def _write_routine(self, batch: Batch) -> bool:
        # Keep the newest row of each run only (rows are cumulative), and a bounded timeline.
        latest = {row.trace_id: row for row in batch.runs}
        batch.runs = list(latest.values())
        if batch.flags:
            batch.flags = list({flag.trace_id: flag for flag in batch.flags}.values())
        if len(batch.calls) > 200_000:
            self._log_once("calls-dropped", "the store is far behind: the oldest timeline rows "
                           "of the unwritten backlog are dropped (counters and verdicts are kept)")
            del batch.calls[: len(batch.calls) - 200_000]
        try:
            self.store.write(batch)
        except Exception as exc:
            # The writer's boundary: a store outage must not kill the thread. The batch is kept
            # and retried (merged with what comes next) until the store answers again.
            self._log_once("routine:" + type(exc).__name__, "run store write failed (kept, retried): %r", exc)
            return False
        return True

    # -- processing -----------------------------------------------------------------------------

    def process(self, views: Sequence[Any], now: float, *, flush: bool = False) -> Outcome:
        with self._fleet_lock:
            out = self.fleet.process(views, now, flush=flush)
        return out

    def begin_apply(self, now: float) -> int:
        """Say that an outcome of ``now`` is being written (the watermark stays below it)."""
        token = next(self._apply_ids)
        self._applying[token] = now
        return token

    def end_apply(self, token: int) -> None:
        self._applying.pop(token, None)

    def _apply_urgent(self, out: Outcome) -> None:
        """Write what must not be lost, raise kill flags; then hand routine writes behind.

        When the store refuses the urgent writes, the outcome is kept (``self.unwritten``) and
        retried by every tick, and the exception propagates (the request gets 503)."""
        now = self.clock()
        m = self.metrics
        for t in out.transitions:
            m.transitions.labels(verdict=t.verdict if t.stop_reason is None else "budget_stop", rule=t.rule or t.stop_reason or "").inc()
            out.urgent.alerts.extend(self.alerts.for_transition(t, now))
        for row in out.ended_runs:
            m.runs.labels(stop_reason=row.stop_reason or (row.receipt or {}).get("reason") or "none").inc()
            out.urgent.alerts.extend(self.alerts.for_end(row.trace_id, row.agent, now))
        m.tool_calls.inc(out.judged_calls)
        if out.late_spans:
            m.spans_late.inc(out.late_spans)
            self._log_once(
                "late",
                "spans came after their run's root span was judged: left out, the receipt stands "
                "(raise --reorder-ms if an exporter sends later than its root's); counted in "
                "tripwire_spans_late_total",
            )
        try:
            self._commit(out)
        except Exception:
            if len(self.unwritten) < 100_000:
                self.unwritten.append(out)
            raise

    def _commit(self, out: Outcome) -> None:
        """Write ``out``; what is done is taken out of it, so a retry never writes it twice.

        Without Redis the flags are rows of the store: they go up in the transaction that
        writes the transitions that raised them (one transaction, not three)."""
        payloads: list[dict[str, Any]] = []
        first: list[Kill] = []
        if out.kills:
            now = self.clock()
            # One flag per run and step: a stuck run that repeated itself ten times in one
            # request is raised (and announced to every subscriber) once, with its latest state.
            latest = {k.trace_id: k for k in out.kills}
            payloads = [
                flag_payload(k.trace_id, k.assessment or k.stop, at=now, message=k.message)
                for k in latest.values()
            ]
            first = [k for k in out.kills if not k.again]
            if self._flags_in_store:
                up = self._flags_up
                fresh = now + self.config.flag_ttl_s / 2
                urgent: list[FlagRow] = []
                renewed: list[FlagRow] = []
                for row in StoreKillChannel.rows(payloads, self.config.flag_ttl_s):
                    # A flag this receiver raised and nobody lowered since, far from expiring,
                    # is up: renewing it (a stuck run that repeated itself) can wait for the
                    # routine writes instead of holding the request behind them.
                    expires = up.get(row.trace_id)
                    (renewed if expires is not None and expires > fresh else urgent).append(row)
                out.urgent.killed = [k.trace_id for k in first]  # set, not added: a retry redoes it
                out.urgent.flags = urgent
                out.routine.flags = renewed
        if out.urgent:
            self.store.write(out.urgent)
            out.urgent = Batch()
        if payloads and self._flags_in_store:
            self.flag_watch.notify(p["trace_id"] for p in payloads)  # up: wake who waits for them
        if out.kills and self._flags_in_store:
            up = self._flags_up
            for p in payloads:
                tid = p["trace_id"]
                up.pop(tid, None)
                up[tid] = p["at"] + self.config.flag_ttl_s
            while len(up) > _FLAGS_UP_MAX:
                up.popitem(last=False)
            for k in first:
                self.metrics.kills.labels(reason=k.reason.value).inc()
        elif out.kills:
            self.store.mark_killed([k.trace_id for k in first])
            try:
                self.kill.raise_flags(payloads, self.config.flag_ttl_s)
            except Exception as exc:
                # Degrade: the run rows say stuck already; the flags are raised again every
                # tick until the channel answers (agents see them late, not never). Logged once.
                self._log_once("kill:" + type(exc).__name__, "raising kill flags failed (retried every tick): %r", exc)
                self.pending_kills.extend(payloads)
                del self.pending_kills[: max(0, len(self.pending_kills) - 100_000)]
            else:
                for k in first:
                    self.metrics.kills.labels(reason=k.reason.value).inc()
        out.kills = []
        if out.routine:
            if self._writer_started:
                self._routine.put(out.routine)
            else:
                self.store.write(out.routine)
            out.routine = Batch()

    def flag_lowered(self, trace_id: str) -> None:
        """An operator lowers the run's flag: should the run repeat itself, it goes up again
        with the transitions of that request, not with the routine writes."""
        self._flags_up.pop(trace_id, None)

    async def operate(
        self, trace_id: str, action: str, *, message: str, actor: str = "unknown", via: str = "api"
    ) -> RunRow | None:
        """An operator's action on a run, from the API or the dashboard: ``kill`` raises its
        flag (saying ``message``, and who acted: ``actor`` through ``via``), ``resolve`` lowers
        it, ``acknowledge`` marks the run seen. Returns the run's row after it, or ``None``
        (nothing done) when the store has no such run: a flag for a trace id nobody sent would
        only wait for a run that never comes.

        A killed run's receipt, when it ends, says ``user_cancelled`` and who acted, not how
        the agent happened to wind up after its stop."""
        if action not in ACTIONS:
            raise ValueError(action)
        store = self.store
        if await asyncio.to_thread(store.run, trace_id) is None:
            return None
        if action == "kill":
            at = self.clock()
            payload = flag_payload(
                trace_id, None, at=at, message=message, by="operator", actor=actor, via=via
            )
            with self._fleet_lock:
                self.fleet.operator_killed(trace_id, actor=actor, via=via, at=at)
            await asyncio.to_thread(self.kill.raise_flag, payload, self.config.flag_ttl_s)
            await asyncio.to_thread(store.set_flags, trace_id, killed=True, resolved=False)
        elif action == "resolve":
            self.flag_lowered(trace_id)
            await asyncio.to_thread(self.kill.clear, trace_id)
            await asyncio.to_thread(store.set_flags, trace_id, resolved=True, killed=False)
        else:
            await asyncio.to_thread(store.set_flags, trace_id, acknowledged=True)
        return await asyncio.to_thread(store.run, trace_id)

    def _retry_unwritten(self) -> None:
        while self.unwritten:
            out = self.unwritten[0]
            self._commit(out)  # raises while the store is still down
            self.unwritten.pop(0)

    def _retry_kills(self) -> None:
        if not self.pending_kills:
            return
        payloads = self.pending_kills
        self.kill.raise_flags(payloads, self.config.flag_ttl_s)
        del self.pending_kills[: len(payloads)]
        logger.warning("raised %d kill flags the channel had refused", len(payloads))

    def saturated(self) -> str | None:
        """Why a new export request must wait (503 with Retry-After), or ``None``."""
        if not self.started.is_set():
            return "the receiver is starting (resuming the runs an earlier one left); retry later"
        if self.unwritten:
            return "the run store is unavailable; retry later"
        if self.inflight >= self.config.max_inflight or self.fleet.buffered >= self.config.max_buffered_spans:
            return "the receiver is saturated; retry later"
        if self._routine.qsize() >= self.config.max_pending_writes:
            return "the run store is behind; retry later"
        if self.spool is not None and self.spool.full:
            return "the write-ahead spool is full (the run store is behind); retry later"
        return None

    def claim_request(self, key: bytes) -> bool:
        """False when an export request with exactly these spans was applied already (an
        exporter retried it after its answer timed out or was lost): acknowledge it, apply
        nothing. True claims ``key``: apply the request, or :meth:`release_request` it.

        Raises:
            redis.RedisError: ``--state redis`` and Redis does not answer.
        """
        if self._redis_requests is not None:
            ttl = max(int(self.fleet.idle_ttl_s * 2), 60)  # as long as the trace logs live
            return bool(self._redis_requests.set(REQUEST_PREFIX + key.hex(), b"1", nx=True, ex=ttl))
        if key in self._recent:
            self._recent.move_to_end(key)
            return False
        self._remember_request(key)
        return True

    def release_request(self, key: bytes) -> None:
        """Undo :meth:`claim_request`: nothing of the request was applied (its retry must be)."""
        if self._redis_requests is not None:
            with contextlib.suppress(Exception):  # then the claim expires with its TTL
                self._redis_requests.delete(REQUEST_PREFIX + key.hex())
        else:
            self._recent.pop(key, None)

    def _remember_request(self, key: bytes) -> None:
        recent = self._recent
        recent[key] = None
        recent.move_to_end(key)
        while len(recent) > RECENT_REQUESTS:
            recent.popitem(last=False)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < 256:
            self._warned.add(key)
            logger.warning(message, *args)

    # -- background ----------------------------------------------------------------------------

    async def tick(self) -> None:
        """Release due spans, end idle traces, write; called every ``flush_s``.

        Also: retry the writes and kill flags an outage refused, move the watermark (what is
        judged and written) and truncate the spool behind it."""
        if self.unwritten:
            await asyncio.to_thread(self._retry_unwritten)
            logger.warning("the run store answers again: the writes it refused are done")
        if self.pending_kills:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._retry_kills)
        now = self.clock()
        # Spans accepted before `now - reorder_s` are released by this tick; outcomes being
        # written by requests keep the watermark below their time.
        mark = min([now, *self._applying.values()]) - self.config.reorder_s - 0.001
        out = self.process((), now)
        if out.urgent or out.kills or out.routine or out.transitions:
            await asyncio.to_thread(self._apply_urgent, out)
        if self._writer_started:
            self._routine.put(mark)
        if self.spool is not None:
            self.spool.release(self.watermark)
        self.metrics.active_traces.set(len(self.fleet))
        self.metrics.queue_depth.set(self.inflight + self.fleet.buffered)

    def authorized(self, request: Request) -> bool:
        return self.actor(request) is not None

    def actor(self, request: Request) -> str | None:
        """Who the request acts for: the name of the token in its bearer header, else of the
        token its dashboard session was opened with; ``None`` when it carries neither (or an
        unknown token, or an ended session). With auth off: ``anonymous``."""
        if not self.config.auth:
            return "anonymous"
        token = self.bearer(request)
        if token is None:
            return self.sessions.actor(request.cookies.get(SESSION_COOKIE, ""), self.clock())
        return self.token_name(token)

    @staticmethod
    def bearer(request: Request) -> str | None:
        """The token of the request's ``Authorization: Bearer`` header, if it has one."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        return token.strip() if scheme.lower() == "bearer" and token.strip() else None

    def csrf_ok(self, request: Request, given: str) -> bool:
        """Whether a state change may go ahead: it authenticated with its ``Authorization``
        header (which no other site's page can send), or ``given`` is its session's CSRF token."""
        if not self.config.auth or self.bearer(request) is not None:
            return True
        return self.sessions.csrf_ok(request.cookies.get(SESSION_COOKIE, ""), given)

    def token_name(self, token: str) -> str | None:
        """The name of an accepted token (``None`` for any other), compared in constant time."""
        given = token.encode()
        found: int | None = None
        for i, accepted in enumerate(self.config.tokens):  # every token compared: constant time
            if hmac.compare_digest(given, accepted.encode()):
                found = i
        if found is None:
            return None
        names = self.config.token_names
        return names[found] if found < len(names) and names[found] else f"token {found + 1}"


# -- HTTP ------------------------------------------------------------------------------------


def _status_body(kind: str, code: int, message: str) -> tuple[bytes, str]:
    """A ``google.rpc.Status`` in the request's encoding (OTLP's error body)."""
    if kind == _PROTOBUF:
        msg = message.encode()
        out = bytearray()
        out += b"\x08" + _varint(code)
        out += b"\x12" + _varint(len(msg)) + msg
        return bytes(out), _PROTOBUF
    return json.dumps({"code": code, "message": message}).encode(), _JSON


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _success_body(kind: str, rejected: int, message: str) -> tuple[bytes, str]:
    if kind == _PROTOBUF:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceResponse,
        )

        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = rejected
            response.partial_success.error_message = message
        return response.SerializeToString(), _PROTOBUF
    body: dict[str, Any] = {}
    if rejected:
        body["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
    return json.dumps(body).encode(), _JSON


def request_key(data: bytes, kind: str) -> bytes:
    """What tells a retried export request from a new one: a digest of its decompressed body
    (exporters resend the same spans; gzip stamps each attempt differently) and its encoding."""
    return xxhash.xxh3_128_digest(data, seed=1 if kind == _JSON else 0)


def create_app(config: ServeConfig, *, service: Service | None = None) -> Starlette:
    """The Starlette app (``uvicorn`` serves it: ``tripwire serve``)."""
    svc = service if service is not None else Service(config)

    def unauthorized() -> Response:
        return JSONResponse(
            {"error": "unauthorized", "detail": "send Authorization: Bearer <token>"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    async def traces(request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind == "application/protobuf":
            kind = _PROTOBUF
        reply_kind = kind if kind in (_PROTOBUF, _JSON) else _JSON
        if not svc.authorized(request):
            svc.metrics.requests.labels(code="401").inc()
            return unauthorized()
        if kind not in (_PROTOBUF, _JSON):
            body, media = _status_body(_JSON, 3, f"unsupported Content-Type {kind or '(none)'}: send application/x-protobuf or application/json")
            svc.metrics.requests.labels(code="415").inc()
            return Response(body, status_code=415, media_type=media)
        why = svc.saturated()
        if why is not None:
            await _discard_body(request, config.max_body_bytes)
            body, media = _status_body(reply_kind, 14, why)
            svc.metrics.requests.labels(code="503").inc()
            return Response(body, status_code=503, media_type=media, headers={"Retry-After": "1"})
        length = request.headers.get("content-length")
        if length is not None and length.isdecimal() and int(length) > config.max_body_bytes:
            body, media = _status_body(reply_kind, 8, f"request body over {config.max_body_bytes} bytes")
            svc.metrics.requests.labels(code="413").inc()
            return Response(body, status_code=413, media_type=media)
        try:
            raw = await asyncio.wait_for(_read_body(request, config.max_body_bytes), config.body_timeout_s)
        except asyncio.TimeoutError:  # a class of its own before Python 3.11
            body, media = _status_body(reply_kind, 4, f"the request body did not arrive within {config.body_timeout_s:g} s")
            svc.metrics.requests.labels(code="408").inc()
            return Response(body, status_code=408, media_type=media, headers={"Connection": "close"})
        if raw is None:
            body, media = _status_body(reply_kind, 8, f"request body over {config.max_body_bytes} bytes")
            svc.metrics.requests.labels(code="413").inc()
            return Response(body, status_code=413, media_type=media)
        why = svc.saturated()  # again: other requests may have filled the slots meanwhile
        if why is not None:
            body, media = _status_body(reply_kind, 14, why)
            svc.metrics.requests.labels(code="503").inc()
            return Response(body, status_code=503, media_type=media, headers={"Retry-After": "1"})
        svc.inflight += 1
        started = time.perf_counter()
        try:
            try:
                encoding = request.headers.get("content-encoding")
                if encoding is None or encoding.strip().lower() in ("", "identity"):
                    data = decompress(bytes(raw), encoding, max_bytes=config.max_body_bytes)
                else:  # up to --max-body-mb of inflating: off the event loop
                    data = await asyncio.to_thread(decompress, bytes(raw), encoding, max_bytes=config.max_body_bytes)
            except InputError as exc:
                too_big = isinstance(exc, BodyTooLarge)
                code = 413 if too_big else 400
                body, media = _status_body(reply_kind, 8 if too_big else 3, str(exc))
                svc.metrics.requests.labels(code=str(code)).inc()
                return Response(body, status_code=code, media_type=media)
            try:
                decoded = decode_request(data, kind)
            except InputError as exc:
                body, media = _status_body(reply_kind, 3, str(exc))
                svc.metrics.requests.labels(code="400").inc()
                svc.metrics.spans_rejected.labels(why="malformed_request").inc()
                return Response(body, status_code=400, media_type=media)
            key = request_key(data, kind)
            try:
                first = svc.claim_request(key)
            except Exception as exc:  # --state redis and Redis does not answer: as below
                svc._log_once("state:" + type(exc).__name__, "the shared state is unavailable: %r", exc)
                body, media = _status_body(reply_kind, 14, "the shared state (Redis) is unavailable; retry later")
                svc.metrics.requests.labels(code="503").inc()
                return Response(body, status_code=503, media_type=media, headers={"Retry-After": "2"})
            if not first:
                # A retried export whose spans were applied already: acknowledged as received,
                # counted once (calls without call ids would otherwise count twice: a false loop).
                svc.metrics.spans_duplicate.inc(len(decoded.views))
                body, media = _success_body(reply_kind, decoded.rejected, decoded.message)
                svc.metrics.requests.labels(code="200").inc()
                return Response(body, status_code=200, media_type=media)
            now = svc.clock()
            token = svc.begin_apply(now)
            try:
                try:
                    out = svc.process(decoded.views, now)
                except Exception as exc:
                    # --state redis and Redis does not answer: nothing of the request is
                    # applied; the exporter retries it (logged once).
                    svc.release_request(key)
                    svc._log_once("state:" + type(exc).__name__, "the shared state is unavailable: %r", exc)
                    body, media = _status_body(reply_kind, 14, "the shared state (Redis) is unavailable; retry later")
                    svc.metrics.requests.labels(code="503").inc()
                    return Response(body, status_code=503, media_type=media, headers={"Retry-After": "2"})
                await asyncio.to_thread(svc._apply_urgent, out)
                if svc.spool is not None:
                    try:
                        svc.spool.append(now, kind, request.headers.get("content-encoding"), bytes(raw))
                    except OSError as exc:  # degrade: acknowledged without write-ahead
                        svc._log_once("spool:" + type(exc).__name__, "write-ahead spool append failed (requests are acknowledged without it): %r", exc)
            except Exception as exc:
                # The store is down: these spans were judged but their transitions could not be
                # written (they are kept and retried). Tell the exporter to retry: the batch
                # it resends is this claimed request, acknowledged then and not applied again.
                svc._log_once("urgent:" + type(exc).__name__, "run store unavailable: %r", exc)
                body, media = _status_body(reply_kind, 14, "the run store is unavailable; retry later")
                svc.metrics.requests.labels(code="503").inc()
                return Response(body, status_code=503, media_type=media, headers={"Retry-After": "2"})
            finally:
                svc.end_apply(token)
            svc.metrics.spans_received.inc(len(decoded.views))
            if decoded.rejected:
                svc.metrics.spans_rejected.labels(why="unreadable_span").inc(decoded.rejected)
            body, media = _success_body(reply_kind, decoded.rejected, decoded.message)
            svc.metrics.requests.labels(code="200").inc()
            return Response(body, status_code=200, media_type=media)
        finally:
            svc.inflight -= 1
            svc.metrics.latency.observe(time.perf_counter() - started)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "started": svc.started.is_set()})

    async def readyz(request: Request) -> Response:
        store_ok = await asyncio.to_thread(svc.store.ping)
        kill_ok = await asyncio.to_thread(svc.kill.ping)
        started = svc.started.is_set()
        ok = store_ok and kill_ok and started
        return JSONResponse(
            {"status": "ready" if ok else "not ready", "store": store_ok, "kill_channel": kill_ok, "started": started},
            status_code=200 if ok else 503,
        )

    async def metrics(request: Request) -> Response:
        if not svc.authorized(request):
            return unauthorized()
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        svc.metrics.active_traces.set(len(svc.fleet))
        svc.metrics.queue_depth.set(svc.inflight + svc.fleet.buffered)
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def list_runs(request: Request) -> Response:
        if not svc.authorized(request):
            return unauthorized()
        try:
            query = _runs_query(request.query_params, svc.clock())
        except ValueError as exc:
            return JSONResponse({"error": "bad query", "detail": str(exc)}, status_code=400)
        rows, total = await asyncio.to_thread(svc.store.runs, **query)
        return JSONResponse(
            {"runs": [r.as_json() for r in rows], "total": total, "limit": query["limit"], "offset": query["offset"]}
        )

    async def one_run(request: Request) -> Response:
        if not svc.authorized(request):
            return unauthorized()
        trace_id = request.path_params["trace_id"].lower()
        row = await asyncio.to_thread(svc.store.run, trace_id)
        if row is None:
            return JSONResponse({"error": "no such run", "trace_id": trace_id}, status_code=404)
        history = await asyncio.to_thread(svc.store.verdicts, trace_id)
        calls = await asyncio.to_thread(svc.store.calls, trace_id)
        flag = await asyncio.to_thread(svc.kill.get, trace_id, svc.clock())
        body = row.as_json()
        body["verdicts"] = [_slots(v) for v in history]
        body["calls"] = [_slots(c) for c in calls]
        body["flag"] = flag
        return JSONResponse(body)

    async def act(request: Request) -> Response:
        actor = svc.actor(request)
        if actor is None:
            return unauthorized()
        if not svc.csrf_ok(request, request.headers.get("x-csrf-token", "")):
            return JSONResponse(
                {"error": "forbidden", "detail": "a signed-in browser's action needs its X-CSRF-Token; "
                 "or send Authorization: Bearer <token>"},
                status_code=403,
            )
        trace_id = request.path_params["trace_id"].lower()
        action = request.path_params["action"]
        if action not in ACTIONS:
            return JSONResponse({"error": "unknown action", "accepted": list(ACTIONS)}, status_code=404)
        row = await svc.operate(trace_id, action, message=f"killed by {actor} through the API", actor=actor, via="api")
        if row is None:
            return JSONResponse({"error": "no such run", "trace_id": trace_id}, status_code=404)
        return JSONResponse({"ok": True, "action": action, "run": row.as_json()})

    async def post_receipt(request: Request) -> Response:
        # An agent's stop receipt (tripwire.serve.posted_receipts): same auth as the actions.
        from tripwire.serve.posted_receipts import (
            MAX_RECEIPT_BYTES,
            read_receipt,
            store_receipt,
            valid_trace_id,
        )

        if svc.actor(request) is None:
            return unauthorized()
        if not svc.csrf_ok(request, request.headers.get("x-csrf-token", "")):
            return JSONResponse({"error": "forbidden", "detail": "send Authorization: Bearer <token>"}, status_code=403)
        trace_id = request.path_params["trace_id"].lower()
        if not valid_trace_id(trace_id):
            await _discard_body(request, MAX_RECEIPT_BYTES)
            return JSONResponse({"error": "bad trace id", "detail": "32 hex characters, not all zero"}, status_code=400)
        try:
            raw = await asyncio.wait_for(_read_body(request, MAX_RECEIPT_BYTES), config.body_timeout_s)
        except asyncio.TimeoutError:
            return JSONResponse({"error": "timeout", "detail": "the body did not arrive in time"}, status_code=408, headers={"Connection": "close"})
        if raw is None:
            return JSONResponse({"error": "too large", "detail": f"a receipt is at most {MAX_RECEIPT_BYTES} bytes"}, status_code=413)
        try:
            receipt, health = read_receipt(bytes(raw), trace_id)
        except InputError as exc:
            return JSONResponse({"error": "not a stop receipt", "detail": str(exc)}, status_code=400)
        held = await asyncio.to_thread(store_receipt, svc, trace_id, receipt, health)
        return JSONResponse({"ok": True, "trace_id": trace_id, "health": health, "stop_reason": receipt["reason"], "pending": held})

    async def one_flag(request: Request) -> Response:
        if not svc.authorized(request):
            return unauthorized()
        trace_id = request.path_params["trace_id"].lower()
        flag = await asyncio.to_thread(svc.kill.get, trace_id, svc.clock())
        return JSONResponse({"trace_id": trace_id, "flag": flag})

    async def many_flags(request: Request) -> Response:
        if not svc.authorized(request):
            return unauthorized()
        try:
            body = await request.json()
            ids = body["trace_ids"]
            if not isinstance(ids, list) or len(ids) > 1000 or not all(isinstance(i, str) for i in ids):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"error": "send {\"trace_ids\": [up to 1000 hex ids]}"}, status_code=400)
        now = svc.clock()

        def read() -> dict[str, Any]:
            found = {}
            for tid in ids:
                flag = svc.kill.get(tid.lower(), now)
                if flag is not None:
                    found[tid.lower()] = flag
            return found

        return JSONResponse({"flags": await asyncio.to_thread(read)})

    async def wait_flags(request: Request) -> Response:
        # The push side of the URL channel: answers as soon as the flags up among `trace_ids`
        # differ from `flagged` (what the agent holds), else when one of them goes up or down,
        # else after `timeout_s` with the same flags (`changed: false`).
        if not svc.authorized(request):
            return unauthorized()
        try:
            body = await request.json()
            ids = body["trace_ids"]
            known = body.get("flagged", [])
            timeout = body.get("timeout_s", WAIT_DEFAULT_S)
            if (
                not isinstance(ids, list) or len(ids) > 1000 or not all(isinstance(i, str) for i in ids)
                or not isinstance(known, list) or not all(isinstance(i, str) for i in known)
                or isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                or not 0 <= timeout <= WAIT_MAX_S
            ):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            return JSONResponse(
                {"error": "send {\"trace_ids\": [up to 1000 hex ids], \"flagged\": [the ids whose "
                 f"flags you hold], \"timeout_s\": 0 to {WAIT_MAX_S:g}}}"},
                status_code=400,
            )
        wanted = list(dict.fromkeys(i.lower() for i in ids))
        held = {i.lower() for i in known} & set(wanted)

        def read() -> dict[str, Any]:
            now = svc.clock()
            found = {}
            for tid in wanted:
                flag = svc.kill.get(tid, now)
                if flag is not None:
                    found[tid] = flag
            return found

        if isinstance(svc.kill, RedisKillChannel):
            svc.kill.listen()  # other receivers' flags wake this one's waiters too
        # The keep-alive of uvicorn's request cycle turns off when the server shuts down: a
        # waiter then answers at once instead of holding the shutdown for its timeout.
        cycle = getattr(request.receive, "__self__", None)
        deadline = time.monotonic() + float(timeout)
        try:
            with svc.flag_watch.watching(wanted) as woken:
                while True:
                    woken.clear()  # before the read: a flag raised after it wakes the wait
                    found = await asyncio.to_thread(read)
                    left = deadline - time.monotonic()
                    if set(found) != held or left <= 0 or svc.flag_watch.closed:
                        return JSONResponse({"flags": found, "changed": set(found) != held})
                    # Woken by this receiver's flags (or Redis pub/sub); re-read every
                    # WAIT_RECHECK_S anyway (another receiver sharing the store without Redis).
                    recheck = time.monotonic() + min(left, WAIT_RECHECK_S)
                    while not woken.is_set() and time.monotonic() < recheck:
                        if cycle is not None and getattr(cycle, "keep_alive", True) is False:
                            return JSONResponse({"flags": found, "changed": False})
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(woken.wait(), timeout=max(0.0, min(0.5, recheck - time.monotonic())))
        except TooManyWaiters:
            return JSONResponse(
                {"error": "too many agents wait for flags on this receiver; poll POST /api/flags"},
                status_code=503, headers={"Retry-After": "1"},
            )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stop = asyncio.Event()

        async def ticker() -> None:
            # Listen at once; resume the runs an earlier receiver left running (100,000 rows
            # took 54 s) and replay its spool meanwhile, export requests answered 503.
            try:
                await asyncio.to_thread(svc.start)
            except Exception as exc:
                svc.start_failed = exc
                logger.error("the receiver could not start (export requests get 503): %r", exc)
                return
            svc.started.set()
            while not stop.is_set():
                try:
                    await svc.tick()
                except Exception as exc:  # the background boundary: log once, keep ticking
                    svc._log_once("tick:" + type(exc).__name__, "background processing failed: %r", exc)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=config.flush_s)

        async def sender() -> None:
            import httpx

            async with httpx.AsyncClient() as client:
                while not stop.is_set():
                    try:
                        await svc.sender.deliver_due(svc.clock(), client)
                    except Exception as exc:  # a store outage: retry on the next round
                        svc._log_once("alerts:" + type(exc).__name__, "alert delivery failed: %r", exc)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=0.5)
                with contextlib.suppress(Exception):
                    await svc.sender.deliver_due(svc.clock(), client)

        tasks = [asyncio.create_task(ticker())]
        if config.alerts:
            tasks.append(asyncio.create_task(sender()))
        try:
            yield
        finally:
            stop.set()
            for task in tasks:
                with contextlib.suppress(Exception):
                    await task
            svc.flag_watch.close()
            await asyncio.to_thread(svc.close)

    routes = [
        Route("/v1/traces", traces, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/api/runs", list_runs, methods=["GET"]),
        Route("/api/runs/{trace_id}", one_run, methods=["GET"]),
        Route("/api/runs/{trace_id}/receipt", post_receipt, methods=["POST"]),
        Route("/api/runs/{trace_id}/{action}", act, methods=["POST"]),
        Route("/api/flags/wait", wait_flags, methods=["POST"]),
        Route("/api/flags/{trace_id}", one_flag, methods=["GET"]),
        Route("/api/flags", many_flags, methods=["POST"]),
    ]
    if config.dashboard:
        from tripwire.serve.dashboard import dashboard_routes

        routes += dashboard_routes(svc)
    async def client_left(request: Request, exc: Exception) -> Response:
        # The client hung up while its request was read: nobody is left to answer, and it is
        # no server error (uvicorn logged each one as an ASGI traceback).
        svc.metrics.requests.labels(code="499").inc()
        return Response(status_code=400)

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(SecurityHeaders)],
        exception_handlers={ClientDisconnect: client_left},
    )
    app.state.service = svc
    return app


async def _read_body(request: Request, limit: int) -> bytearray | None:
    """The request's body, or ``None`` past ``limit`` bytes (the rest left unread)."""
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            return None
    return raw


async def _discard_body(request: Request, limit: int) -> None:
    """Read a refused request's body to its end, so that the connection stays usable (closing
    it with unread data resets it, which exporters see as a failure, not a retry hint)."""
    seen = 0
    with contextlib.suppress(Exception):
        async for chunk in request.stream():
            seen += len(chunk)
            if seen > limit:
                return


def _slots(value: Any) -> dict[str, Any]:
    # A Struct's __slots__ are sorted: its fields in declaration order, as a dataclass's are.
    names = getattr(value, "__struct_fields__", None) or value.__slots__
    return {name: getattr(value, name) for name in names}


_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "verdict": tuple(v.value for v in Verdict),
    "stop_reason": tuple(r.value for r in StopReason),
    "health": tuple(h.value for h in HealthState),
    "status": ("running", "ended"),
}
"""The values a run's column can hold: a filter on anything else is a typo, not an empty list."""


def _runs_query(q: Mapping[str, str], now: float) -> dict[str, Any]:
    """``GET /api/runs``'s query as :meth:`RunStore.runs` arguments.

    Raises:
        ValueError: naming the parameter, when a value is not one a run can have, ``limit``
            is not a whole number from 1 to :data:`~tripwire.store.runs.MAX_PAGE`, ``offset`` is negative or not a
            number, or ``since`` is not a duration or a time.
    """
    # An empty value (``?agent=&verdict=stuck``, as forms and query builders send) is no filter.
    query: dict[str, Any] = {"agent": q.get("agent") or None}
    for name, choices in _CHOICES.items():
        value = q.get(name) or None
        if value is not None and value not in choices:
            raise ValueError(f"{name}: {value!r} is none of {', '.join(choices)}")
        query[name] = value
    for name, default, low, high in (("limit", 50, 1, MAX_PAGE), ("offset", 0, 0, MAX_OFFSET)):
        text = q.get(name) or None
        try:
            number = default if text is None else int(text)
        except ValueError:
            raise ValueError(f"{name}: {text!r} is not a whole number") from None
        if number < low or (high is not None and number > high):
            raise ValueError(f"{name}: {number} is out of range (from {low}{f' to {high}' if high else ''})")
        query[name] = number
    text = q.get("since")
    try:
        query["since"] = _since(text, now)
    except ValueError:
        raise ValueError(f"since: {text!r} is neither a duration (7d, 12h, 30m, 90s) nor Unix seconds") from None
    return query


def _since(text: str | None, now: float) -> float | None:
    """``7d``, ``12h``, ``30m``, ``90s`` back from now, or Unix seconds; ``None`` when absent."""
    if not text:
        return None
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    if text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return now - float(text[:-1]) * units[text[-1]]
    at = float(text)
    if not math.isfinite(at):
        raise ValueError(f"not a time: {text!r}")
    return at
