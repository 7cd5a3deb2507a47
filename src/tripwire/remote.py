"""The agent's side of the fleet service's kill channel: stop at the next step after
``tripwire serve`` judged this run stuck, in any framework.

::

    import tripwire.remote

    tripwire.remote.connect(redis_url="redis://127.0.0.1:6379/0")   # or url="http://host:4318"
    ...
    tripwire.remote.check(trace_id)     # raises LoopDetected / BudgetExceeded once flagged

:func:`connect` starts one daemon thread that keeps a local cache of flags: with Redis it
subscribes to the service's pub/sub channel (a flag arrives within milliseconds) and also reads
the keys of the runs this process asked about (a flag raised before the subscription is not
missed); with only the service's URL it waits on the service's long poll (``POST
/api/flags/wait``), which answers as soon as a flag of one of those runs goes up or down (a
service without it is polled every ``poll_s``). :func:`check` never touches the network: it is one dictionary lookup, so it is safe
on the agent's hot path. A raised flag is also put into the in-process kill-flag registry
(:data:`tripwire.otel.killswitch.KILL_FLAGS`) when the ``otel`` extra is installed, so
``tripwire.check()`` and the framework integrations stop the run too.

When the channel cannot be reached, ``on_unavailable`` decides: ``"fail_open"`` (default: the
run goes on, logged once) or ``"fail_closed"`` (``check`` raises
:class:`~tripwire.errors.BudgetExceeded` with reason ``user_cancelled`` once the channel has
been unreachable for longer than ``grace_s``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Final, Literal

from tripwire.core.reasons import Rule, StopReason
from tripwire.errors import BudgetExceeded, ConfigError, LoopDetected, RunStopped

if TYPE_CHECKING:
    from tripwire.core.budget import Stop
    from tripwire.core.watch import Assessment

__all__ = [
    "RemoteKill",
    "cause_for",
    "check",
    "connect",
    "current",
    "disconnect",
    "exception_for",
]

logger = logging.getLogger("tripwire.remote")

KEY_PREFIX: Final = "tripwire:kill:"
CHANNEL: Final = "tripwire:kill"
MAX_WATCHED: Final = 10_000
"""Runs whose flag this process polls at most (least recently checked dropped first)."""


def exception_for(payload: dict[str, Any]) -> RunStopped:
    """The exception a flag's JSON stands for (what the in-process processor would raise)."""
    kind = payload.get("kind")
    reason = _reason(payload.get("reason"))
    if kind == "loop":
        try:
            rule = Rule(payload.get("rule", "repetition"))
        except ValueError:
            rule = Rule.REPETITION
        return LoopDetected(
            rule=rule,
            tool=str(payload.get("tool", ""))[:200],
            hits=_int(payload.get("hits")),
            window=_int(payload.get("window")),
            period=_int(payload.get("period")) or 1,
            call_index=_int(payload.get("call_index")),
            digest=str(payload.get("digest", ""))[:16],
            reason=reason,
        )
    message = str(payload.get("message") or "the fleet service stopped this run")[:500]
    return BudgetExceeded(
        message,
        reason=reason or StopReason.USER_CANCELLED,
        limit_name=str(payload.get("limit_name") or "operator"),
        limit=_float(payload.get("limit")),
        observed=_float(payload.get("observed")),
        level="stop",
    )


class RemoteKill:
    """A local cache of the fleet service's kill flags, kept fresh by one daemon thread.

    Args:
        redis_url: the Redis the service raises flags in (pub/sub + keys).
        url: the service's base URL (``http://127.0.0.1:4318``), when there is no Redis: its
            long poll pushes each flag (an older service without it is polled).
        token: the bearer token for ``url`` (default ``TRIPWIRE_TOKEN`` is *not* read here:
            pass it; :func:`connect` reads the environment).
        poll_s: how often the flags of the runs this process checks are re-read (Redis keys; a
            service without the long poll).
        on_unavailable: ``"fail_open"`` or ``"fail_closed"`` (see the module docstring).
        grace_s: how long the channel may be unreachable before ``fail_closed`` stops runs.
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        url: str | None = None,
        token: str | None = None,
        poll_s: float = 0.5,
        on_unavailable: Literal["fail_open", "fail_closed"] = "fail_open",
        grace_s: float = 5.0,
    ) -> None:
        if (redis_url is None) == (url is None):
            raise ConfigError("redis_url/url", (redis_url, url), "exactly one of the two")
        if on_unavailable not in ("fail_open", "fail_closed"):
            raise ConfigError("on_unavailable", on_unavailable, "'fail_open' or 'fail_closed'")
        if isinstance(poll_s, bool) or not isinstance(poll_s, (int, float)) or not 0 < poll_s <= 60:
            raise ConfigError("poll_s", poll_s, "a number of seconds in (0, 60]")
        self.redis_url = redis_url
        self.url = url.rstrip("/") if url is not None else None
        self.token = token
        self.poll_s = float(poll_s)
        self.on_unavailable = on_unavailable
        self.grace_s = grace_s
        self._flags: dict[str, dict[str, Any]] = {}
        self._watched: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._down_since: float | None = None
        self._warned = False
        self._refused_status: int | None = None
        """The HTTP status (401/403) of the service's last refusal of the token, until a
        request is accepted again."""
        self._warned_refused = False
        self._thread = threading.Thread(target=self._run, name="tripwire-remote", daemon=True)
        self._thread.start()

    # -- the agent's side ----------------------------------------------------------------------

    def check(self, trace_id: str | int) -> None:
        """Raise the run's stop if the service flagged it. One dict lookup; no network.

        The trace id is watched from now on (its flag is read by the background thread).

        Raises:
            LoopDetected: the service judged the run stuck (or :class:`BudgetExceeded` for a
                bound or an operator's kill, or with ``fail_closed`` when the channel is down
                past ``grace_s``).
            ConfigError: ``trace_id`` is not a trace id (an int of at most 128 bits or 32 hex
                characters): a run checked under another id would never be stopped; or the
                service refused this process's token (HTTP 401/403, see :meth:`lookup`).
        """
        flag = self.lookup(trace_id)
        if flag is not None:
            raise exception_for(flag)

    def lookup(self, trace_id: str | int) -> dict[str, Any] | None:
        """The run's flag JSON if the service raised one, else ``None``; watches the trace id.

        No network: a dict lookup (and, the first time, adding the id to the watched set).

        Raises:
            BudgetExceeded: ``fail_closed`` and the channel has been unreachable past
                ``grace_s`` (reason ``user_cancelled``).
            ConfigError: the service refused this process's token (HTTP 401/403): a refusal
                is a setting to fix, not an outage, so ``fail_open`` does not let the run go
                on unprotected; or ``trace_id`` is not a trace id.
        """
        tid = _hex(trace_id)
        flag = self._flags.get(tid)
        if flag is not None:
            return flag
        if tid not in self._watched:
            with self._lock:
                self._watched[tid] = None
                while len(self._watched) > MAX_WATCHED:
                    self._watched.popitem(last=False)
        refused = self._refused_status
        if refused is not None:
            raise ConfigError("TRIPWIRE_TOKEN", _token_state(self.token, refused), _accepted(self.url))
        down = self._down_since
        if (
            self.on_unavailable == "fail_closed"
            and down is not None
            and time.monotonic() - down > self.grace_s
        ):
            raise BudgetExceeded(
                "the fleet service's kill channel is unreachable and this agent is set to "
                "fail_closed: stopping the run (set on_unavailable='fail_open' to go on)",
                reason=StopReason.USER_CANCELLED,
                limit_name="kill_channel",
                limit=self.grace_s,
                observed=time.monotonic() - down,
                level="stop",
            )
        return None

    def flagged(self, trace_id: str | int) -> dict[str, Any] | None:
        """The run's flag JSON if one is up (no network)."""
        return self._flags.get(_hex(trace_id))

    def close(self) -> None:
        """Stop the background thread (idempotent)."""
        self._stop.set()
        self._thread.join(timeout=2)

    # -- the background thread ---------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.redis_url is not None:
                    self._redis_loop()
                else:
                    self._http_loop()
            except Exception as exc:
                # The channel's own boundary: nothing here may kill the thread silently or
                # reach the agent. A refused token is said as such; anything else marks the
                # channel down. Log once, retry after a pause.
                status = getattr(getattr(exc, "response", None), "status_code", None)
                if status in (401, 403):
                    self._refused(status)
                else:
                    self._down(exc)
                self._stop.wait(min(self.poll_s * 4, 2.0))

    def _redis_loop(self) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url or "", socket_timeout=2, socket_connect_timeout=2)
        pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call, unused-ignore]
        pubsub.subscribe(CHANNEL)
        try:
            self._up()
            next_poll = 0.0
            while not self._stop.is_set():
                message = pubsub.get_message(timeout=min(self.poll_s, 0.2))
                if message is not None and message.get("type") == "message":
                    self._take(message.get("data"))
                now = time.monotonic()
                if now >= next_poll:
                    next_poll = now + self.poll_s
                    watched = list(self._watched)
                    if watched:
                        values = client.mget([KEY_PREFIX + t for t in watched])
                        for tid, text in zip(watched, values, strict=True):
                            if text is not None:
                                self._take(text)
                            elif tid in self._flags:
                                self._flags.pop(tid, None)
                    self._up()
        finally:
            pubsub.close()
            client.close()

    def _http_loop(self) -> None:
        """Wait for the watched runs' flags at ``POST /api/flags/wait`` (a long poll the service
        answers as soon as one goes up or down), asking again at once when this process starts
        watching a new run; against a service without it (404/405), poll ``POST /api/flags``
        every ``poll_s`` as before. One event loop in this thread; :meth:`check` never waits on it."""
        import asyncio
        import contextlib

        import httpx

        wait_s = 20.0  # the service answers by then when nothing changed
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}

        def seen() -> tuple[int, str | None]:
            # What check() added (it appends new ids under the lock); read 50 times a second.
            with self._lock:
                return len(self._watched), next(reversed(self._watched), None)

        async def changed(since: tuple[int, str | None], at_most: float) -> None:
            end = time.monotonic() + at_most
            while seen() == since and not self._stop.is_set() and time.monotonic() < end:
                await asyncio.sleep(0.02)

        def apply(watched: list[str], flags: Any) -> None:
            if not isinstance(flags, dict):
                return
            for tid in watched:
                flag = flags.get(tid)
                if flag is not None:
                    self._take(json.dumps(flag))
                elif self._flags.pop(tid, None) is not None:
                    _clear_local(tid)  # lowered (Resolve): tripwire.check() lets the run go on

        async def main() -> None:
            timeout = httpx.Timeout(2.0, read=wait_s + 10.0)
            async with httpx.AsyncClient(base_url=self.url or "", headers=headers, timeout=timeout) as client:
                push_from = 0.0  # when to wait for flags again (not before: poll)
                while not self._stop.is_set():
                    push = time.monotonic() >= push_from
                    since = seen()
                    with self._lock:
                        watched = list(self._watched)[-1000:]
                    if not watched:
                        self._up()
                        await changed(since, self.poll_s)
                        continue
                    if not push:
                        response = await client.post("/api/flags", json={"trace_ids": watched})
                        response.raise_for_status()
                        apply(watched, response.json().get("flags"))
                        self._up()
                        await changed(since, self.poll_s)  # a new run is asked about at once
                        continue
                    body = {
                        "trace_ids": watched,
                        "flagged": [t for t in watched if t in self._flags],
                        "timeout_s": wait_s,
                    }
                    asked = time.monotonic()
                    request = asyncio.ensure_future(client.post("/api/flags/wait", json=body))
                    moved = asyncio.ensure_future(changed(since, wait_s + 15.0))
                    await asyncio.wait((request, moved), return_when=asyncio.FIRST_COMPLETED)
                    moved.cancel()
                    if not request.done():
                        # A new run to watch (or close()): ask again with it; the service
                        # answers at once if a flag changed meanwhile.
                        request.cancel()
                        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                            await request
                        continue
                    response = request.result()
                    if response.status_code in (404, 405):  # an older service: poll it
                        push_from = float("inf")
                        logger.info("the tripwire service has no POST /api/flags/wait: polling every %s s", self.poll_s)
                        continue
                    if response.status_code == 503:  # too many waiters there: poll for a while
                        push_from = time.monotonic() + 30.0
                        continue
                    response.raise_for_status()
                    apply(watched, response.json().get("flags"))
                    self._up()
                    if time.monotonic() - asked < 0.02:
                        await asyncio.sleep(0.02)  # at most 50 answers a second, whatever comes

        asyncio.run(main())

    def _take(self, data: Any) -> None:
        if isinstance(data, bytes):
            data = data.decode("utf-8", "replace")
        try:
            payload = json.loads(data)
        except (TypeError, ValueError):
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("trace_id"), str):
            return
        tid = payload["trace_id"].lower()
        if payload.get("cleared"):
            self._flags.pop(tid, None)
            _clear_local(tid)
            return
        if len(self._flags) >= MAX_WATCHED and tid not in self._flags:
            self._flags.pop(next(iter(self._flags)))
        self._flags[tid] = payload
        _raise_local(tid, payload)

    def _up(self) -> None:
        """The channel answered (call after a request the service accepted)."""
        if self._down_since is not None:
            logger.warning("tripwire kill channel reachable again")
        self._down_since = None
        if self._refused_status is not None:
            logger.warning("tripwire kill channel: the service accepts the token again")
            self._refused_status = None
            self._warned_refused = False

    def _refused(self, status: int) -> None:
        """The service refused the token (HTTP ``status``, 401 or 403): not an outage.

        A channel loop calls it on such an answer (instead of raising), then waits as after
        an outage. Logged once, as an auth refusal naming ``TRIPWIRE_TOKEN``; until a request
        is accepted again (:meth:`_up`), :meth:`check` raises
        :class:`~tripwire.errors.ConfigError`, whatever ``on_unavailable`` says.
        """
        self._refused_status = status
        self._down_since = None
        if not self._warned_refused:
            self._warned_refused = True
            logger.error(
                "tripwire kill channel: the service at %s refused the token (HTTP %d): set "
                "TRIPWIRE_TOKEN (or connect(token=...)) to a token `tripwire serve` accepts; "
                "until then tripwire.remote.check() raises ConfigError (logged once)",
                self.url,
                status,
            )

    def _down(self, exc: Exception) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        if not self._warned:
            self._warned = True
            logger.warning(
                "tripwire kill channel unreachable (%s); runs go on (%s) until it is back",
                type(exc).__name__,
                self.on_unavailable,
            )


_DEFAULT: RemoteKill | None = None
_DEFAULT_LOCK = threading.Lock()
_ENV_READ = False
"""Whether :func:`current` has looked for a channel in the environment (once per connect)."""

PROBE_TIMEOUT_S: Final = 2.0
"""How long :func:`connect` waits for the service's answer to its one token probe."""


def connect(
    *,
    redis_url: str | None = None,
    url: str | None = None,
    token: str | None = None,
    poll_s: float = 0.5,
    on_unavailable: Literal["fail_open", "fail_closed"] = "fail_open",
) -> RemoteKill:
    """Start (once) the process-wide kill-channel cache; later calls return the same one.

    Without arguments, ``TRIPWIRE_REDIS_URL`` or ``TRIPWIRE_URL`` (and ``TRIPWIRE_TOKEN``) name
    the channel. With the service's URL, one short request (at most
    :data:`PROBE_TIMEOUT_S`) asks whether the service accepts the token: a refusal fails
    here, not silently later; an unreachable service is an outage (``on_unavailable``).

    Raises:
        ConfigError: no channel named (or both), a setting is invalid, or the service
            refused the token (HTTP 401/403; the message names ``TRIPWIRE_TOKEN``, never the
            token).
    """
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is not None:
            return _DEFAULT
        redis_url, url, token = _settings(redis_url, url, token)
        if url is not None and redis_url is None:
            _probe(url, token)
        _DEFAULT = RemoteKill(
            redis_url=redis_url, url=url, token=token, poll_s=poll_s, on_unavailable=on_unavailable
        )
        return _DEFAULT


def current() -> RemoteKill | None:
    """The process-wide channel: the one :func:`connect` started, else one the environment
    names (``TRIPWIRE_REDIS_URL`` or ``TRIPWIRE_URL``, with ``TRIPWIRE_TOKEN``), started on
    first use without waiting on the network; ``None`` when neither.

    The environment is read once (until :func:`disconnect`); an invalid setting there is
    logged once and leaves the process without a channel rather than failing the agent.
    """
    remote = _DEFAULT
    if remote is not None or _ENV_READ:
        return remote
    return _from_environment()


def _from_environment() -> RemoteKill | None:
    global _DEFAULT, _ENV_READ
    with _DEFAULT_LOCK:
        if _DEFAULT is not None or _ENV_READ:
            return _DEFAULT
        _ENV_READ = True
        redis_url, url, token = _settings(None, None, None)
        if redis_url is None and url is None:
            return None
        try:
            _DEFAULT = RemoteKill(redis_url=redis_url, url=url, token=token)
        except ConfigError as exc:
            logger.error("tripwire kill channel not started from the environment: %s", exc)
            return None
        return _DEFAULT


def _settings(
    redis_url: str | None, url: str | None, token: str | None
) -> tuple[str | None, str | None, str | None]:
    import os

    if redis_url is None and url is None:
        redis_url = os.environ.get("TRIPWIRE_REDIS_URL") or None
        url = None if redis_url else (os.environ.get("TRIPWIRE_URL") or None)
    if token is None:
        token = os.environ.get("TRIPWIRE_TOKEN") or None
    return redis_url, url, token


def _probe(url: str, token: str | None) -> None:
    """One request to the service: raise ConfigError if it refuses the token."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.post(
            url.rstrip("/") + "/api/flags",
            json={"trace_ids": []},
            headers=headers,
            timeout=PROBE_TIMEOUT_S,
        )
    except httpx.HTTPError as exc:  # an outage, not a refusal: on_unavailable decides later
        logger.warning("tripwire kill channel: %s did not answer the token probe (%s)", url,
                       type(exc).__name__)  # fmt: skip
        return
    if response.status_code in (401, 403):
        raise ConfigError(
            "TRIPWIRE_TOKEN", _token_state(token, response.status_code), _accepted(url)
        )


def _token_state(token: str | None, status: int) -> str:
    """What is wrong with the token, for a message (never the token itself)."""
    return f"<not set: HTTP {status}>" if not token else f"<refused: HTTP {status}>"


def _accepted(url: str | None) -> str:
    return f"a bearer token the service at {url} accepts (one of its TRIPWIRE_TOKEN or --token-file)"


def disconnect() -> None:
    """Stop the process-wide cache started by :func:`connect` (tests, shutdown); the
    environment is read again at the next :func:`current`."""
    global _DEFAULT, _ENV_READ
    with _DEFAULT_LOCK:
        _ENV_READ = False
        if _DEFAULT is not None:
            _DEFAULT.close()
            _DEFAULT = None


def check(trace_id: str | int) -> None:
    """Raise the run's stop if the fleet service flagged it (no-op without a channel:
    neither :func:`connect` nor the environment named one)."""
    remote = current()
    if remote is not None:
        remote.check(trace_id)


_HEX_DIGITS: Final = "0123456789abcdef"


def _hex(trace_id: str | int) -> str:
    """The service's spelling of a trace id: 32 lower-case hex characters.

    Anything else is refused: a run checked under an id the service never writes (an
    OpenAI Agents ``trace_…`` id, a UUID with dashes, a span id) would never be stopped.
    """
    if isinstance(trace_id, int) and not isinstance(trace_id, bool):
        if 0 <= trace_id < 1 << 128:
            return f"{trace_id:032x}"
    elif isinstance(trace_id, str):
        tid = trace_id.lower()
        if len(tid) == 32 and not tid.strip(_HEX_DIGITS):
            return tid
    else:
        raise ConfigError("trace_id", type(trace_id).__name__, _TRACE_ID)
    shown: object = trace_id
    if isinstance(trace_id, int) and trace_id > 0:
        shown = f"<an int of {trace_id.bit_length()} bits>"  # repr() of a huge int can fail
    elif isinstance(trace_id, str) and len(trace_id) > 80:
        shown = trace_id[:80] + "…"
    raise ConfigError("trace_id", shown, _TRACE_ID)


_TRACE_ID: Final = (
    "the run's OpenTelemetry trace id: an int of at most 128 bits "
    "(span.get_span_context().trace_id) or its 32 hex characters"
)


def _reason(value: Any) -> StopReason | None:
    try:
        return StopReason(value)
    except ValueError:
        return None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def cause_for(payload: dict[str, Any]) -> Assessment | Stop:
    """The guard's cause for a flag's JSON: a ``stuck`` loop assessment, or a stop (a budget
    the fleet enforces, or an operator's kill: ``user_cancelled``, saying who)."""
    from tripwire.core.budget import Stop
    from tripwire.core.reasons import Verdict
    from tripwire.core.watch import Assessment

    if payload.get("kind") == "loop":
        exc = exception_for(payload)
        assert isinstance(exc, LoopDetected)
        return Assessment(
            verdict=Verdict.STUCK,
            rule=exc.rule,
            tool=exc.tool,
            digest=exc.digest,
            hits=exc.hits,
            period=exc.period,
            window=exc.window,
            call_index=exc.call_index,
            reason=str(payload.get("message") or "")[:500],
        )
    limit_name = str(payload.get("limit_name") or "operator")
    message = str(payload.get("message") or "the fleet service stopped this run")[:500]
    actor = payload.get("actor")
    if payload.get("kind") == "operator" and isinstance(actor, str) and actor and actor not in message:
        message = f"{message} (by {actor[:200]})"
    return Stop(
        reason=_reason(payload.get("reason")) or StopReason.USER_CANCELLED,
        limit_name=limit_name,
        limit=_float(payload.get("limit")),
        observed=_float(payload.get("observed")),
        counter=limit_name,
        used=_float(payload.get("observed")),
        message=message,
    )


def _raise_local(trace_id: str, payload: dict[str, Any]) -> None:
    """Mirror the flag into the in-process registry, so tripwire.check() raises it too."""
    try:
        from tripwire.otel.killswitch import KILL_FLAGS
    except ImportError:  # no otel extra: only remote.check() knows the flag
        return
    KILL_FLAGS.raise_flag(trace_id, cause_for(payload))


def _clear_local(trace_id: str) -> None:
    try:
        from tripwire.otel.killswitch import KILL_FLAGS
    except ImportError:
        return
    KILL_FLAGS.clear(trace_id)
