"""What keeps a browser from acting for the service's owner: dashboard sessions, the sign-in
throttle, and the security headers on every response.

- **Sessions.** Signing in with a bearer token gives the browser a random session id, not the
  token: the cookie is worth nothing once the session ends (12 hours, or a restart), and a
  stolen cookie never reveals a token the agents use. The session remembers the name of the
  token it was opened with, so an operator's Kill says who acted.
- **CSRF.** A page on another port of the same host is "same site": ``SameSite=Strict`` does not
  stop it from posting with the cookie. Every state change a cookie authenticates must carry the
  session's CSRF token (the dashboard's forms do; the API takes it as ``X-CSRF-Token``), or
  authenticate with the ``Authorization`` header instead, which no other page can send.
- **Throttle.** At most :data:`LOGIN_FAILURES` failed sign-ins per client address per
  :data:`LOGIN_WINDOW_S`; more get 429 with ``Retry-After``.
- **Headers.** ``Content-Security-Policy`` (the dashboard serves its own script and style and
  nothing else; no framing), ``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and
  ``Referrer-Policy: no-referrer``, on every response.

Sessions and throttle counts live in the receiver's memory (bounded). Behind several receivers,
route a browser to one of them (sticky sessions), or sign in again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from typing import Any, Final

__all__ = [
    "LOGIN_FAILURES",
    "LOGIN_WINDOW_S",
    "SECURITY_HEADERS",
    "SESSION_COOKIE",
    "SESSION_TTL_S",
    "LoginThrottle",
    "SecurityHeaders",
    "Sessions",
]

SESSION_COOKIE: Final = "tripwire_session"
SESSION_TTL_S: Final = 12 * 3600.0
MAX_SESSIONS: Final = 10_000
"""Sessions kept at most (the oldest ended first)."""
LOGIN_FAILURES: Final = 10
LOGIN_WINDOW_S: Final = 60.0
MAX_THROTTLED: Final = 10_000
"""Client addresses whose failures are counted at most (the least recent forgotten first)."""

SECURITY_HEADERS: Final = (
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        b"form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class Sessions:
    """Dashboard sessions: a random id each, holding the name of the token it was opened with."""

    def __init__(self, *, ttl_s: float = SESSION_TTL_S, cap: int = MAX_SESSIONS) -> None:
        self.ttl_s = ttl_s
        self.cap = cap
        self._secret = secrets.token_bytes(32)
        self._by_id: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def open(self, actor: str, now: float) -> str:
        """A new session for ``actor`` (the token's name); returns its id (the cookie's value)."""
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._by_id[sid] = (actor, now + self.ttl_s)
            while len(self._by_id) > self.cap:
                self._by_id.popitem(last=False)
        return sid

    def actor(self, sid: str, now: float) -> str | None:
        """The session's token name, or ``None`` for an unknown or expired session."""
        if not sid:
            return None
        with self._lock:
            held = self._by_id.get(sid)
            if held is None:
                return None
            if held[1] <= now:
                del self._by_id[sid]
                return None
            return held[0]

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)

    def csrf(self, sid: str) -> str:
        """The session's CSRF token (derived from its id: nothing more to keep)."""
        return hmac.new(self._secret, sid.encode(), hashlib.sha256).hexdigest()[:32] if sid else ""

    def csrf_ok(self, sid: str, given: str) -> bool:
        return bool(sid) and hmac.compare_digest(self.csrf(sid), given)


class LoginThrottle:
    """Failed sign-ins counted per client address over a sliding window."""

    def __init__(
        self, *, failures: int = LOGIN_FAILURES, window_s: float = LOGIN_WINDOW_S, cap: int = MAX_THROTTLED
    ) -> None:
        self.failures = failures
        self.window_s = window_s
        self.cap = cap
        self._seen: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait_s(self, client: str, now: float) -> float:
        """How long ``client`` must wait before its next attempt (0: it may try now)."""
        with self._lock:
            times = self._seen.get(client)
            if not times:
                return 0.0
            times[:] = [t for t in times if t > now - self.window_s]
            if len(times) < self.failures:
                return 0.0
            return times[0] + self.window_s - now

    def failed(self, client: str, now: float) -> None:
        with self._lock:
            times = self._seen.setdefault(client, [])
            times.append(now)
            del times[: -self.failures]
            self._seen.move_to_end(client)
            while len(self._seen) > self.cap:
                self._seen.popitem(last=False)


class SecurityHeaders:
    """ASGI middleware: :data:`SECURITY_HEADERS` on every HTTP response (a header the response
    set itself is left as it is)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(h for h in SECURITY_HEADERS if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
