"""Redis-backed ledger and idempotency store: one budget for agents in several processes.

The ledger's check-and-add is one Lua script, so concurrent agents can never together go over
a cap: either every counter of a reservation fits and all are added, or none is. Keys of one
run share a hash tag (``{run}``), so the scripts also work on Redis Cluster.

Every call uses short socket timeouts (default 50 ms) and no client-side retries, so a slow or
dead Redis never blocks the agent for long, and runs with OpenTelemetry instrumentation
suppressed, so tripwire's own Redis calls create no spans for it to watch.

When Redis is unreachable the ledger does what ``on_unavailable`` says:

- ``"fail_open"`` (default): log one warning, count locally (in-process) until Redis answers
  again (retried every ``retry_after_s``). The local count of each counter starts from the last
  total Redis reported to this process (which includes everything this process spent), so every
  cap still holds per process; what was spent locally is added to Redis as soon as it answers
  again (reconciled), so the shared totals and the receipts count what really happened. During
  one outage a process may reserve only ``outage_share`` (default 10%) of what was left of each
  capped counter when Redis last answered it; past that share the run stops (a
  :class:`~tripwire.store.base.StoreUnavailable` the guard turns into a stop that says so; the
  share is rounded up, so each process may reserve at least one). So N processes sharing a cap
  go over it by at most ``N * outage_share`` of what was left (plus one each), per outage
  (eight processes: 80% of what was left at worst, where each could once spend all of it);
- ``"fail_closed"``: raise :class:`~tripwire.store.base.StoreUnavailable`; the guard stops the
  run with a :class:`~tripwire.errors.BudgetExceeded`.

The idempotency store always fails closed: running a side effect whose first run cannot be
checked could do it twice.

Needs the ``redis`` extra: ``pip install 'tripwire[redis]'``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from tripwire.errors import ConfigError
from tripwire.store.base import (
    OnUnavailable,
    OutageShareSpent,
    Record,
    Reservation,
    StoreUnavailable,
)

try:
    import redis as _redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tripwire.store.redis needs the redis client: pip install 'tripwire[redis]'"
    ) from exc

__all__ = ["RedisIdempotencyStore", "RedisLedger", "connect"]

logger = logging.getLogger("tripwire.store.redis")

DEFAULT_URL: Final = "redis://127.0.0.1:6379/0"
DEFAULT_TIMEOUT_S: Final = 0.05
_MAX_SEEN: Final = 4096
"""How many counters' last totals the ledger remembers for a fail-open outage (bounded: one
process may serve many runs; the oldest are forgotten first)."""
_MAX_KEY: Final = 1024
"""Counters with longer names are not remembered (their local count starts at 0)."""

_RESERVE: Final = """
local ttl = tonumber(ARGV[1])
local n = #KEYS
local totals = {}
for i = 1, n do
  local cur = tonumber(redis.call('GET', KEYS[i]) or '0')
  local amount = tonumber(ARGV[2 * i])
  local cap = tonumber(ARGV[2 * i + 1])
  if cap >= 0 and cur + amount > cap then
    local now = {}
    for j = 1, n do now[j] = tonumber(redis.call('GET', KEYS[j]) or '0') end
    return {i, now}
  end
  totals[i] = cur + amount
end
for i = 1, n do
  redis.call('INCRBY', KEYS[i], ARGV[2 * i])
  if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
end
return {0, totals}
"""

_ADD: Final = """
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS do
  out[i] = redis.call('INCRBY', KEYS[i], ARGV[i + 1])
  if ttl > 0 then redis.call('EXPIRE', KEYS[i], ttl) end
end
return out
"""

_RELEASE: Final = """
if redis.call('GET', KEYS[1]) == 'p' then return redis.call('DEL', KEYS[1]) end
return 0
"""

_ERRORS: Final = (_redis.RedisError, OSError)


def connect(url: str = DEFAULT_URL, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> _redis.Redis:
    """A Redis client with short timeouts and no retries, as tripwire's stores want it."""
    if not timeout_s > 0:
        raise ConfigError("timeout_s", timeout_s, "a number of seconds > 0")
    return _redis.Redis.from_url(
        url,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry_on_timeout=False,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
    )


@contextlib.contextmanager
def _no_spans() -> Iterator[None]:
    """Suppress OpenTelemetry instrumentation (e.g. the redis instrumentor) for our own calls."""
    try:
        from opentelemetry import context as otel_context
    except ImportError:
        yield
        return
    token = otel_context.attach(
        otel_context.set_value(otel_context._SUPPRESS_INSTRUMENTATION_KEY, True)
    )
    try:
        yield
    finally:
        otel_context.detach(token)


class RedisLedger:
    """The budget ledger in Redis: atomic check-and-add by Lua script.

    Args:
        client: a Redis client; default :func:`connect` ``(url, timeout_s=timeout_s)``. A client
            you pass is used as is: give it short timeouts yourself.
        url: where Redis is, when no client is given.
        prefix: prefix of every key (use one per application or test).
        on_unavailable: ``"fail_open"`` or ``"fail_closed"`` (see the module docstring).
        timeout_s: socket and connect timeout of the default client.
        ttl_s: counters expire this long after their last change (0 = never).
        retry_after_s: after a failure in ``fail_open`` mode, how long to count locally before
            trying Redis again.
        outage_share: in ``fail_open`` mode, the share (0 to 1) of what was left of a capped
            counter that this process may reserve while Redis is unreachable, per outage
            (1: all of it, as before 0.2).
        clock: the clock for ``retry_after_s`` (injectable for tests).
    """

    remote = True

    def __init__(
        self,
        client: _redis.Redis | None = None,
        *,
        url: str = DEFAULT_URL,
        prefix: str = "tripwire",
        on_unavailable: OnUnavailable = "fail_open",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        ttl_s: int = 86_400,
        retry_after_s: float = 5.0,
        outage_share: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if on_unavailable not in ("fail_open", "fail_closed"):
            raise ConfigError("on_unavailable", on_unavailable, "'fail_open' or 'fail_closed'")
        if (
            isinstance(outage_share, bool)
            or not isinstance(outage_share, (int, float))
            or not 0 <= outage_share <= 1
        ):
            raise ConfigError("outage_share", outage_share, "a share from 0 to 1")
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or ttl_s < 0:
            raise ConfigError("ttl_s", ttl_s, "an integer number of seconds >= 0")
        self.client = client if client is not None else connect(url, timeout_s=timeout_s)
        self.prefix = prefix
        self.on_unavailable: OnUnavailable = on_unavailable
        self.ttl_s = ttl_s
        self.retry_after_s = retry_after_s
        self.failures = 0
        """How many Redis calls failed (each one degraded as ``on_unavailable`` says)."""
        self._clock = clock
        self._down_until = float("-inf")
        self._warned = False
        self._seen: dict[str, int] = {}
        """The last total Redis reported for each counter (the base of the local count)."""
        self._pending: dict[str, int] = {}
        """What this process spent while Redis was unreachable, to add once it answers."""
        self.reconciled = 0
        """How many times a local (fail-open) spend was added back to Redis."""
        self.outage_share = float(outage_share)
        self._allowance: dict[str, int] = {}
        """What this process may reserve of each capped counter during the current outage."""
        self._lock = threading.Lock()
        self._reserve = self.client.register_script(_RESERVE)
        self._add = self.client.register_script(_ADD)

    def key(self, counter: str) -> str:
        """The Redis key of a counter."""
        return f"{self.prefix}:{counter}"

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run one Redis call; on failure degrade (fail_open → None) or raise StoreUnavailable.

        In fail-open mode, what was counted locally during an outage is added to Redis first.
        """
        if self._clock() < self._down_until:
            return None
        try:
            with _no_spans():
                if self._pending:
                    self._reconcile()
                elif self._allowance:
                    self._allowance.clear()  # Redis answers: the next outage gets a new share
                return fn()
        except _ERRORS as exc:
            self.failures += 1
            if self.on_unavailable == "fail_closed":
                raise StoreUnavailable("Redis ledger", f"{type(exc).__name__}: {exc}") from exc
            self._down_until = self._clock() + self.retry_after_s
            with self._lock:
                warn, self._warned = not self._warned, True
            if warn:
                logger.warning(
                    "Redis ledger unreachable (%s: %s); on_unavailable='fail_open': counting "
                    "budgets locally in this process until it answers again",
                    type(exc).__name__,
                    exc,
                )
            return None

    def reserve(self, items: Sequence[tuple[str, int, int | None]]) -> Reservation:
        """See :meth:`tripwire.store.base.Ledger.reserve`."""
        keys = [self.key(k) for k, _, _ in items]
        args: list[int] = [self.ttl_s]
        for _, amount, cap in items:
            args += (amount, -1 if cap is None else cap)
        reply = self._call(lambda: self._reserve(keys=keys, args=args))
        if reply is None:
            return self._local_reserve(items)
        index, raw = reply
        totals = tuple(int(t) for t in raw)
        self._remember([k for k, _, _ in items], totals)
        return Reservation(totals=totals, refused=int(index) - 1 if int(index) else None)

    def add(self, items: Sequence[tuple[str, int]]) -> list[int]:
        """See :meth:`tripwire.store.base.Ledger.add`."""
        keys = [self.key(k) for k, _ in items]
        args = [self.ttl_s, *(amount for _, amount in items)]
        reply = self._call(lambda: self._add(keys=keys, args=args))
        if reply is None:
            with self._lock:
                pending = self._pending
                for k, amount in items:
                    pending[k] = pending.get(k, 0) + amount
                return [self._local_total(k) for k, _ in items]
        totals = [int(t) for t in reply]
        self._remember([k for k, _ in items], totals)
        return totals

    def get(self, counters: Sequence[str]) -> list[int]:
        """See :meth:`tripwire.store.base.Ledger.get`."""
        if not counters:
            return []
        keys = [self.key(k) for k in counters]
        reply = self._call(lambda: self.client.mget(keys))
        if reply is None:
            with self._lock:
                return [self._local_total(k) for k in counters]
        totals = [int(v) if v is not None else 0 for v in reply]
        self._remember(counters, totals)
        return totals

    # -- fail-open bookkeeping ------------------------------------------------------------

    def _local_total(self, counter: str) -> int:
        """The local view of a counter during an outage (call with the lock held)."""
        return self._seen.get(counter, 0) + self._pending.get(counter, 0)

    def _local_reserve(self, items: Sequence[tuple[str, int, int | None]]) -> Reservation:
        with self._lock:
            now = [self._local_total(k) for k, _, _ in items]
            for i, ((_, amount, cap), total) in enumerate(zip(items, now, strict=True)):
                if cap is not None and total + amount > cap:
                    return Reservation(totals=tuple(now), refused=i)
            for k, amount, cap in items:
                if cap is None:
                    continue
                allowed = self._allowance.get(k)
                if allowed is None:  # the first reservation of this counter in this outage
                    left = max(0, cap - self._seen.get(k, 0))
                    allowed = self._allowance[k] = math.ceil(left * self.outage_share)
                if self._pending.get(k, 0) + amount > allowed:
                    raise OutageShareSpent(
                        "Redis ledger",
                        f"this process has reserved its outage share of {k} ({allowed}: "
                        f"outage_share={self.outage_share:g} of what was left when Redis last "
                        "answered); other processes may be spending the rest",
                    )
            pending = self._pending
            for k, amount, _ in items:
                pending[k] = pending.get(k, 0) + amount
            return Reservation(totals=tuple(t + a for t, (_, a, _) in zip(now, items, strict=True)))

    def _remember(self, counters: Sequence[str], totals: Sequence[int]) -> None:
        with self._lock:
            seen = self._seen
            for k, total in zip(counters, totals, strict=True):
                if len(k) > _MAX_KEY:
                    continue
                if k not in seen and len(seen) >= _MAX_SEEN:
                    del seen[next(iter(seen))]  # the oldest first: bounded in count
                seen[k] = total

    def _reconcile(self) -> None:
        """Add what was counted locally during an outage to Redis (raises if it is down)."""
        with self._lock:
            pending = dict(self._pending)
        if not pending:
            return
        counters = list(pending)
        keys = [self.key(k) for k in counters]
        totals = [int(t) for t in self._add(keys=keys, args=[self.ttl_s, *pending.values()])]
        with self._lock:
            for k, amount in pending.items():
                left = self._pending.get(k, 0) - amount
                if left > 0:
                    self._pending[k] = left
                else:
                    self._pending.pop(k, None)
            if not self._pending:
                self._allowance.clear()  # Redis answers: the next outage gets a new share
            self.reconciled += 1
        self._remember(counters, totals)


class RedisIdempotencyStore:
    """Operation records in Redis (``SET NX`` claims). Fails closed when Redis is unreachable.

    The records are only as durable as Redis: a Redis that restarts without persistence
    (no AOF and no RDB snapshot, or one older than the record) has forgotten every operation,
    so a repeated operation *runs again*; so does one whose record expired (``ttl_s``). Use
    ``appendonly yes`` (``appendfsync everysec`` loses at most a second), or the SQLite store,
    for side effects that must never repeat. A claim that cannot reach Redis raises
    :class:`~tripwire.store.base.StoreUnavailable` and the action does not run; a record that
    cannot be written after the action ran is retried and then kept by the wrapper (see
    :mod:`tripwire.idempotency`): that failure is never reported as "not running".

    Args:
        client: a Redis client; default :func:`connect` ``(url, timeout_s=timeout_s)``.
        url: where Redis is, when no client is given.
        prefix: prefix of every key.
        ttl_s: how long a record is kept (0 = forever).
        timeout_s: socket and connect timeout of the default client.
    """

    def __init__(
        self,
        client: _redis.Redis | None = None,
        *,
        url: str = DEFAULT_URL,
        prefix: str = "tripwire:idem",
        ttl_s: int = 7 * 86_400,
        timeout_s: float = 0.25,
    ) -> None:
        self.client = client if client is not None else connect(url, timeout_s=timeout_s)
        self.prefix = prefix
        self.ttl_s = ttl_s
        self._release = self.client.register_script(_RELEASE)

    def _key(self, operation_id: str) -> str:
        return f"{self.prefix}:{operation_id}"

    def _do(self, fn: Callable[[], Any]) -> Any:
        try:
            with _no_spans():
                return fn()
        except _ERRORS as exc:
            raise StoreUnavailable(
                "Redis idempotency store", f"{type(exc).__name__}: {exc}"
            ) from exc

    def claim(self, operation_id: str) -> Record | None:
        """See :meth:`tripwire.store.base.IdempotencyStore.claim`."""
        key = self._key(operation_id)
        ex = self.ttl_s or None
        if self._do(lambda: self.client.set(key, b"p", nx=True, ex=ex)):
            return None
        value = self._do(lambda: self.client.get(key))
        if value is None:  # expired or released in between: still not ours to run
            return Record("pending")
        raw = bytes(value)
        return Record("done", raw[1:]) if raw[:1] == b"d" else Record("pending")

    def complete(self, operation_id: str, payload: bytes) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.complete`."""
        key = self._key(operation_id)
        self._do(lambda: self.client.set(key, b"d" + payload, ex=self.ttl_s or None))

    def release(self, operation_id: str) -> None:
        """See :meth:`tripwire.store.base.IdempotencyStore.release`."""
        key = self._key(operation_id)
        self._do(lambda: self._release(keys=[key]))
