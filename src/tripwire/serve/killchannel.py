"""The kill channel: how a verdict the fleet service reached stops an agent in another process.

When the service judges a run ``stuck`` (or a budget stop fires), it raises the run's flag:

- with Redis (``--redis URL``): ``SET tripwire:kill:<trace_id> <flag JSON> EX <ttl>`` and
  ``PUBLISH tripwire:kill <flag JSON>``. Agents subscribe (:mod:`tripwire.remote`), or read the
  key, and stop at their next step;
- without Redis: a row in the run store's ``tripwire_flags`` table, which agents read through
  ``GET /api/flags/<trace_id>`` (:mod:`tripwire.remote` with the service's URL).

The flag's JSON (:func:`flag_payload`) carries what the agent needs to raise the same
exception the in-process span processor would: the stop reason, and the loop's rule, tool,
hits, window, period, call index and a digest prefix, or the budget's limit name, limit and
observed value. Never arguments.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final, Protocol

from tripwire.core.budget import Stop
from tripwire.core.reasons import stop_reason_for
from tripwire.core.watch import Assessment
from tripwire.store.runs import Batch, FlagRow, RunStore

__all__ = [
    "ACTIONS",
    "CHANNEL",
    "KEY_PREFIX",
    "KillChannel",
    "RedisKillChannel",
    "StoreKillChannel",
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

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    def from_url(cls, url: str) -> RedisKillChannel:
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2))

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

    def clear(self, trace_id: str) -> bool:
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(KEY_PREFIX + trace_id)
        pipe.publish(CHANNEL, json.dumps({"trace_id": trace_id, "cleared": True}))
        deleted, _ = pipe.execute()
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

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def raise_flag(self, payload: dict[str, Any], ttl_s: float) -> None:
        self.raise_flags([payload], ttl_s)

    def raise_flags(self, payloads: list[dict[str, Any]], ttl_s: float) -> None:
        self.store.write(Batch(flags=self.rows(payloads, ttl_s)))

    @staticmethod
    def rows(payloads: list[dict[str, Any]], ttl_s: float) -> list[FlagRow]:
        """The store's rows of these flags, each raised at its ``at`` for ``ttl_s``."""
        return [
            FlagRow(p["trace_id"], p.get("reason", ""), json.dumps(p), p["at"], p["at"] + ttl_s)
            for p in payloads
        ]

    def clear(self, trace_id: str) -> bool:
        return self.store.clear_flag(trace_id)

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
