"""Per-trace state in Redis, so that receivers are stateless behind any load balancer.

Each trace has an event log in Redis, ``tripwire:log:<trace_id>``: a list of the records its
spans became (:class:`~tripwire.serve.fleet.Rec`: digests and counters, never raw arguments
unless ``--store-raw``). A receiver that accepts spans of a trace appends their records in one
atomic ``RPUSH`` (so one request's records are contiguous), reads the records other receivers
appended since it last looked (``LRANGE``), and applies the whole log, in log order, to its own
cached copy of the trace's state. Every receiver therefore sees the same records in the same
order, and reaches the same verdicts as a single receiver would; each one acts (writes, raises
flags, pages) only on the records it appended. A receiver without a cached copy (it restarted,
or evicted the trace) replays the log from the start.

Going idle is decided through the log too: a receiver that found a trace quiet appends an
``END`` record only if the log did not grow meanwhile (a small Lua script), so exactly one
receiver writes the run's receipt. Logs expire ``2 × idle_ttl_s`` after their last append and
are capped at :data:`MAX_LOG` records per trace (past it, a receiver judges the trace's new
spans from its own copy only, and logs that once).

Keys are one per trace, so the scheme works on Redis Cluster as is.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Final

import msgspec

from tripwire.core.signature import Signature
from tripwire.serve.fleet import END, Fleet, Outcome, Rec

__all__ = ["LOG_PREFIX", "MAX_LOG", "RedisFleet"]

logger = logging.getLogger("tripwire.serve")

LOG_PREFIX: Final = "tripwire:log:"
MAX_LOG: Final = 100_000
MAX_CURSORS: Final = 200_000

_APPEND_IF_LEN: Final = """
if redis.call('LLEN', KEYS[1]) == tonumber(ARGV[1]) then
  redis.call('RPUSH', KEYS[1], ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
"""

_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(Rec)


class RedisFleet(Fleet):
    """A :class:`~tripwire.serve.fleet.Fleet` whose per-trace state lives in Redis logs.

    Args:
        client: a ``redis.Redis`` (or Redis Cluster) client.
        **options: the :class:`Fleet` options.
    """

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(**options)
        self.client = client
        self._cursor: OrderedDict[str, int] = OrderedDict()
        """How many records of each trace's log this receiver has applied."""
        self._append_if_len = client.register_script(_APPEND_IF_LEN)
        self._ttl = max(int(self.idle_ttl_s * 2), 60)
        self._warned_full = False

    def _commit(
        self, records: list[tuple[str, Rec, Signature | None]], now: float, out: Outcome
    ) -> None:
        replace = msgspec.structs.replace
        for _tid, rec, _sig in records:
            call = rec.tool
            if call is not None and call.arguments is not None:
                rec.tool = replace(call, arguments=None)  # the log holds digests only
        groups = self._by_trace(records)
        if self.replaying:
            self._adopt_logged(groups, now, out)
            if not groups:
                return
        pipe = self.client.pipeline(transaction=False)
        for tid, recs in groups.items():
            key = LOG_PREFIX + tid
            pipe.rpush(key, *[_ENCODER.encode(r) for _, r, _ in recs])
            pipe.expire(key, self._ttl)
        answers = pipe.execute()
        lengths = answers[0::2]
        reads = self.client.pipeline(transaction=False)
        plan: list[tuple[str, list[tuple[str, Rec, Signature | None]], int, bool]] = []
        for (tid, recs), length in zip(groups.items(), lengths, strict=True):
            first_mine = int(length) - len(recs)
            # After a run's end the state is fresh, so a known cursor is always where to go
            # on from; an unknown one (never seen, or evicted) replays the whole log.
            start = self._cursor.get(tid, 0)
            if start > first_mine:  # the log expired and began again: start afresh
                start = 0
                self._traces.pop(tid, None)
            if start == 0:  # the whole log goes in: its root (or END) ends the run again
                self._ended.take(tid)
                self._quiet.take(tid)
            fetch = start < first_mine
            if fetch:
                reads.lrange(LOG_PREFIX + tid, start, first_mine - 1)
            plan.append((tid, recs, first_mine, fetch))
            if length > MAX_LOG and not self._warned_full:
                self._warned_full = True
                logger.warning("a trace's event log passed %d records; later receivers may disagree", MAX_LOG)
        fetched = iter(reads.execute()) if any(p[3] for p in plan) else iter(())
        for tid, recs, first_mine, fetch in plan:
            if fetch:
                self._catch_up(tid, [_DECODER.decode(raw) for raw in next(fetched)], now)
            self._apply_all(tid, recs, now, out)
            self._remember(tid, first_mine + len(recs))

    def _adopt_logged(
        self, groups: dict[str, list[tuple[str, Rec, Signature | None]]], now: float, out: Outcome
    ) -> None:
        """Replaying the spool: take out of ``groups`` the records the shared logs hold already.

        A request the previous life of this receiver accepted was appended to its traces' logs
        before the 200, and may have been judged and written too; appended again, each of its
        calls would count twice (twice as many identical calls: a false loop). A record is
        known by its span's id, matched once per copy in the log; a record without one (a
        span with an empty id, or a log written before records carried it) by its encoding.
        Not by the encoding alone: a receiver restarted with another digest key or normalizer
        makes other records of the same spans. A trace whose log holds some of the request's
        records is rebuilt from its whole log with every record applied as this receiver's
        own: whatever the dead process did not write gets written now, and what it did write
        is written again as the same rows (runs and calls are upserts, verdict rows and alerts
        are deduplicated), so nothing is lost and nothing counts twice. The rest of the request
        goes on as new records.
        """
        reads = self.client.pipeline(transaction=False)
        tids = list(groups)
        for tid in tids:
            reads.lrange(LOG_PREFIX + tid, 0, -1)
        for tid, logged in zip(tids, reads.execute(), strict=True):
            if not logged:
                continue
            decoded = [_DECODER.decode(raw) for raw in logged]
            copies: dict[str | bytes, int] = {}
            for raw, rec in zip(logged, decoded, strict=True):
                known = rec.span or raw
                copies[known] = copies.get(known, 0) + 1
            fresh: list[tuple[str, Rec, Signature | None]] = []
            for item in groups[tid]:
                known = item[1].span or _ENCODER.encode(item[1])
                left = copies.get(known, 0)
                if left:
                    copies[known] = left - 1
                else:
                    fresh.append(item)
            if len(fresh) == len(groups[tid]):
                continue  # none of it was logged: the usual path
            self._traces.pop(tid, None)
            self._ended.take(tid)
            self._quiet.take(tid)
            self._apply_all(tid, [(tid, rec, None) for rec in decoded], now, out)
            self._remember(tid, len(logged))
            if fresh:
                groups[tid] = fresh
            else:
                del groups[tid]
            trace = self._traces.get(tid)
            if trace is not None:
                trace.dirty = True

    def _catch_up(self, tid: str, recs: list[Rec], now: float) -> None:
        """Apply records other receivers appended: same state, but no writes and no actions."""
        scratch = Outcome()
        self._apply_all(tid, [(tid, rec, None) for rec in recs], now, scratch)
        trace = self._traces.get(tid)
        if trace is not None:
            trace.dirty = False
            trace.timeline.clear()

    def _remember(self, tid: str, position: int) -> None:
        cursors = self._cursor
        cursors[tid] = position
        cursors.move_to_end(tid)
        while len(cursors) > MAX_CURSORS:
            old, _ = cursors.popitem(last=False)
            self._traces.pop(old, None)

    def _evict(self, tid: str, now: float, out: Outcome) -> None:
        # Another receiver may carry the run on: only our cached copy goes (the log stays).
        self._traces.pop(tid, None)
        self._cursor.pop(tid, None)

    def _end_idle(self, now: float, out: Outcome) -> None:
        self._forget(now)
        limit = now - self.idle_ttl_s
        traces = self._traces
        while traces:
            tid, trace = next(iter(traces.items()))
            if trace.last_seen >= limit:
                break
            position = self._cursor.get(tid, 0)
            end = Rec(kind=END, idle=True)
            appended = self._append_if_len(
                keys=[LOG_PREFIX + tid], args=[position, _ENCODER.encode(end), self._ttl]
            )
            if appended:
                self._apply(tid, end, now, out)
                self._remember(tid, position + 1)
            else:
                news = self.client.lrange(LOG_PREFIX + tid, position, -1)
                self._catch_up(tid, [_DECODER.decode(raw) for raw in news], now)
                self._remember(tid, position + len(news))
                if tid in traces:
                    traces[tid].last_seen = now
                    traces.move_to_end(tid)
