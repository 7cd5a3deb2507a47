"""The kill channel: how a verdict the fleet service reached stops an agent in another process.

When the service judges a run ``stuck`` (or a budget stop fires), it raises the run's flag:

- with Redis (``--redis URL``): ``SET tripwire:kill:<trace_id> <flag JSON> EX <ttl>`` and
  ``PUBLISH tripwire:kill <flag JSON>``. Agents subscribe (:mod:`tripwire.remote`), or read the
  key, and stop at their next step;
- without Redis: a row in the run store's ``tripwire_flags`` table, which agents read through
  ``GET /api/flags/<trace_id>`` (:mod:`tripwire.remote` with the service's URL).

Either way, agents that reach the service by URL can wait for their flags instead of polling:
``POST /api/flags/wait`` answers as soon as a flag of one of its trace ids goes up or down. The
receiver wakes those waiters (:class:`FlagWatch`) when it raises or lowers a flag itself and,
with Redis, when any receiver announces one on the pub/sub channel
(:meth:`RedisKillChannel.listen`).

The flag's JSON (:func:`flag_payload`) carries what the agent needs to raise the same
exception the in-process span processor would: the stop reason, and the loop's rule, tool,
hits, window, period, call index and a digest prefix, or the budget's limit name, limit and
observed value. Never arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Final, Protocol

from tripwire.core.budget import Stop
from tripwire.core.reasons import stop_reason_for
from tripwire.core.watch import Assessment
from tripwire.store.runs import Batch, FlagRow, RunStore

__all__ = [
    "ACTIONS",
    "CHANNEL",
    "KEY_PREFIX",
    "MAX_WAITERS",
    "FlagWatch",
    "KillChannel",
    "RedisKillChannel",
    "StoreKillChannel",
    "TooManyWaiters",
    "flag_payload",
]

logger = logging.getLogger("tripwire.serve")

ACTIONS: Final = ("kill", "resolve", "acknowledge")
"""What an operator can do to a run (the API's and the dashboard's ``/{trace_id}/{action}``):
raise its flag, lower it, mark the run seen."""

KEY_PREFIX: Final = "tripwire:kill:"
"""Redis key of a run's flag: this prefix and the trace id (32 hex)."""
CHANNEL: Final = "tripwire:kill"
"""Redis pub/sub channel every flag (and every clear) is published on."""
DEFAULT_TTL_S: Final = 3600.0
MAX_WAITERS: Final = 1024
"""Requests a receiver holds open in ``POST /api/flags/wait`` at most (more get 503)."""


class TooManyWaiters(Exception):
    """:data:`MAX_WAITERS` requests wait already."""


class FlagWatch:
    """Wakes the requests that wait for the flags of some trace ids (``POST /api/flags/wait``).

    :meth:`notify` is called from any thread (the receiver's worker threads raise flags, the
    Redis listener thread relays other receivers' flags); each waiter is an
    :class:`asyncio.Event` set on its own event loop. What changed is not carried: a woken
    waiter reads its flags again from the channel, so a lost or spurious wake-up costs one
    read, never a wrong answer.
    """

    def __init__(self, max_waiters: int = MAX_WAITERS) -> None:
        self.max_waiters = max_waiters
        self._lock = threading.Lock()
        self._by_trace: dict[str, list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
        self._all: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []
        self.closed = False

    def __len__(self) -> int:
        return len(self._all)

    @contextlib.contextmanager
    def watching(self, trace_ids: Iterable[str]) -> Iterator[asyncio.Event]:
        """An event set when a flag of one of ``trace_ids`` may have changed (or at
        :meth:`close`). Enter it on the event loop, before reading the flags.

        Raises:
            TooManyWaiters: :attr:`max_waiters` are waiting already.
        """
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        ids = set(trace_ids)
        with self._lock:
            if len(self._all) >= self.max_waiters:
                raise TooManyWaiters
            self._all.append(waiter)
            for tid in ids:
                self._by_trace.setdefault(tid, []).append(waiter)
        if self.closed:
            waiter[1].set()
        try:
            yield waiter[1]
        finally:
            with self._lock:
                self._all.remove(waiter)
                for tid in ids:
                    waiters = self._by_trace.get(tid)
                    if waiters is not None:
                        waiters.remove(waiter)
                        if not waiters:
                            del self._by_trace[tid]

    def notify(self, trace_ids: Iterable[str]) -> None:
        """A flag of each of ``trace_ids`` went up or down: wake whoever waits for it."""
        with self._lock:
            if not self._by_trace:
                return
            woken = [w for tid in trace_ids for w in self._by_trace.get(tid, ())]
        self._wake(woken)

    def close(self) -> None:
        """Wake every waiter (shutdown); later ones are woken at once."""
        self.closed = True
        with self._lock:
            woken = list(self._all)
        self._wake(woken)

    @staticmethod
    def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]) -> None:
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits there
                loop.call_soon_threadsafe(event.set)


def flag_payload(
    trace_id: str,
    cause: Assessment | Stop | None,
    *,
    at: float,
    message: str = "",
    by: str = "tripwire serve",
    actor: str | None = None,
    via: str | None = None,
) -> dict[str, Any]:
    """The flag's JSON object for a loop assessment, a budget stop, or an operator's kill.

    An operator's kill (``cause=None``) also says who acted (``actor``: the name of the token
    they signed in or called the API with) and where (``via``: ``dashboard`` or ``api``); the
    agent's receipt and the service's carry both.
    """
    out: dict[str, Any] = {"trace_id": trace_id, "at": at, "by": by}
    if isinstance(cause, Assessment):
        out.update(
            kind="loop",
            reason=stop_reason_for(cause.rule).value,
            rule=cause.rule.value if cause.rule is not None else "repetition",
            tool=cause.tool or "",
            hits=cause.hits,
            window=cause.window,
            period=cause.period or 1,
            call_index=cause.call_index,
            digest=(cause.digest or "")[:16],
            message=cause.reason,
        )
    elif isinstance(cause, Stop):
        out.update(
            kind="budget",
            reason=cause.reason.value,
            limit_name=cause.limit_name,
            limit=cause.limit,
            observed=cause.observed,
            message=cause.message,
        )
    else:
        out.update(
            kind="operator",
            reason="user_cancelled",
            message=message or "killed by an operator",
            actor=actor or "unknown",
            via=via or "api",
        )
    return out


class KillChannel(Protocol):
    """Where flags go up. Methods are called from the service's worker threads."""

    def raise_flag(self, payload: dict[str, Any], ttl_s: float) -> None: ...

    def raise_flags(self, payloads: list[dict[str, Any]], ttl_s: float) -> None: ...

    def clear(self, trace_id: str) -> bool: ...

    def get(self, trace_id: str, now: float) -> dict[str, Any] | None: ...

    def ping(self) -> bool: ...


class RedisKillChannel:
    """Flags as Redis keys with a TTL, announced on pub/sub (works with Redis Cluster: one key
    per trace, and the publish goes to the whole cluster)."""

    def __init__(self, client: Any, *, watch: FlagWatch | None = None) -> None:
        self.client = client
        self.watch = watch
        self._listener: threading.Thread | None = None
        self._listen_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, watch: FlagWatch | None = None) -> RedisKillChannel:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), watch=watch)

    def listen(self) -> None:
        """Relay the flags every receiver announces on :data:`CHANNEL` to :attr:`watch`, from one
        daemon thread (started once; it ends when the watch is closed). Redis unreachable: it
        retries every second (logged once); meanwhile waiters see flags at their periodic re-read."""
        with self._listen_lock:
            if self.watch is None or self._listener is not None:
                return
            self._listener = threading.Thread(target=self._listen, name="tripwire-flag-listener", daemon=True)
            self._listener.start()

    def _listen(self) -> None:
        watch = self.watch
        assert watch is not None
        warned = False
        while not watch.closed:
            pubsub = None
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(CHANNEL)
                while not watch.closed:
                    message = pubsub.get_message(timeout=0.5)
                    if message is None or message.get("type") != "message":
                        continue
                    with contextlib.suppress(TypeError, ValueError, AttributeError):
                        tid = json.loads(message["data"]).get("trace_id")
                        if isinstance(tid, str):
                            watch.notify([tid.lower()])
            except Exception as exc:  # the listener's boundary: Redis down; retried
                if not warned:
                    warned = True
                    logger.warning("the kill channel's pub/sub listener lost Redis (retried every second): %r", exc)
                threading.Event().wait(1.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()

    def raise_flag(self, payload: dict[str, Any], ttl_s: float) -> None:
        self.raise_flags([payload], ttl_s)

    def raise_flags(self, payloads: list[dict[str, Any]], ttl_s: float) -> None:
        if not payloads:
            return
        pipe = self.client.pipeline(transaction=False)
        for payload in payloads:
            text = json.dumps(payload)
            pipe.set(KEY_PREFIX + payload["trace_id"], text, ex=max(1, int(ttl_s)))
            pipe.publish(CHANNEL, text)
        pipe.execute()
        if self.watch is not None:
            self.watch.notify(p["trace_id"] for p in payloads)

    def clear(self, trace_id: str) -> bool:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(KEY_PREFIX + trace_id)
        pipe.publish(CHANNEL, json.dumps({"trace_id": trace_id, "cleared": True}))
        deleted, _ = pipe.execute()
        if self.watch is not None:
            self.watch.notify([trace_id])
        return bool(deleted)

    def get(self, trace_id: str, now: float) -> dict[str, Any] | None:
        text = self.client.get(KEY_PREFIX + trace_id)
        if text is None:
            return None
        value = json.loads(text)
        return value if isinstance(value, dict) else None

    def ping(self) -> bool:
        try:
            return bool(self.client.ping())
        except Exception:  # any client failure means "not reachable" here
            return False


class StoreKillChannel:
    """Flags as rows of the run store (no Redis): agents poll ``GET /api/flags/<trace_id>``."""

    def __init__(self, store: RunStore, *, watch: FlagWatch | None = None) -> None:
        self.store = store
        self.watch = watch

    def raise_flag(self, payload: dict[str, Any], ttl_s: float) -> None:
        self.raise_flags([payload], ttl_s)

    def raise_flags(self, payloads: list[dict[str, Any]], ttl_s: float) -> None:
        self.store.write(Batch(flags=self.rows(payloads, ttl_s)))
        if self.watch is not None:
            self.watch.notify(p["trace_id"] for p in payloads)

    @staticmethod
    def rows(payloads: list[dict[str, Any]], ttl_s: float) -> list[FlagRow]:
        """The store's rows of these flags, each raised at its ``at`` for ``ttl_s``."""
        return [
            FlagRow(p["trace_id"], p.get("reason", ""), json.dumps(p), p["at"], p["at"] + ttl_s)
            for p in payloads
        ]

    def clear(self, trace_id: str) -> bool:
        cleared = self.store.clear_flag(trace_id)
        if self.watch is not None:
            self.watch.notify([trace_id])
        return cleared

    def get(self, trace_id: str, now: float) -> dict[str, Any] | None:
        row = self.store.flag(trace_id, now)
        if row is None:
            return None
        try:
            value = json.loads(row["message"])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def ping(self) -> bool:
        return self.store.ping()
