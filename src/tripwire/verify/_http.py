"""HTTP verifier: a URL answers with the expected status and (optionally) a version string."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit, urlunsplit

from tripwire.core.receipt import OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify._common import (
    DEFAULT_TIMEOUT_S,
    Clock,
    Deadline,
    Finding,
    check_timeout,
    require,
    run_check,
)

__all__ = ["HttpCheck", "redact_url"]

_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def redact_url(url: str) -> str:
    """The URL without user info, query string or fragment (they often carry tokens).

    Never raises: a port that is not a number 0..65535 is shown as ``:?``, a URL that does not
    parse at all (``http://[::1/x``) as ``<unparsable URL>``.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        netloc = f"{host}:?"
    else:
        netloc = f"{host}:{port}" if port else host
    query = "?…" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, "", "")) + query


def _port_error(url: str) -> str | None:
    try:
        port = urlsplit(url).port
    except ValueError:
        return "a port 1..65535"
    if port == 0:
        return "a port 1..65535"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpCheck:
    """Check that an HTTP endpoint serves what the run deployed or published.

    Example: ``HttpCheck(url="https://app.example.com/version", contains="1.4.2")()``.
    Headers (e.g. ``Authorization``) are sent but never recorded; the receipt's target is the
    URL without credentials or query string. At most ``max_body_bytes`` of the body are read
    when looking for ``contains``.
    """

    url: str
    """The URL to request (``http`` or ``https``)."""
    expected_status: int = 200
    """The status code the final response must have."""
    contains: str | None = None
    """A string (e.g. the new version) the response body must contain."""
    method: str = "GET"
    """The HTTP method."""
    headers: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    """Request headers; not recorded anywhere."""
    follow_redirects: bool = True
    """Whether to follow redirects; the status compared is the final one."""
    max_body_bytes: int = 1 << 20
    """How much of the body to read when looking for ``contains``."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time budget of the whole request, in seconds."""
    clock: Clock = time.time
    """Where ``checked_at`` comes from."""

    def __post_init__(self) -> None:
        require("httpx")
        if not isinstance(self.url, str):
            raise ConfigError("HttpCheck.url", "<url>", "an http:// or https:// URL")
        try:
            scheme = urlsplit(self.url).scheme
        except ValueError as exc:  # an unclosed IPv6 bracket, say
            raise ConfigError("HttpCheck.url", "<url>", f"a URL that parses ({exc})") from None
        if scheme not in ("http", "https"):
            raise ConfigError("HttpCheck.url", "<url>", "an http:// or https:// URL")
        if not urlsplit(self.url).hostname:
            raise ConfigError("HttpCheck.url", redact_url(self.url), "a URL with a host")
        bad_port = _port_error(self.url)
        if bad_port is not None:
            raise ConfigError("HttpCheck.url", redact_url(self.url), f"a URL with {bad_port}")
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise ConfigError("HttpCheck.headers", "<headers>", "a mapping of str to str")
        status = self.expected_status
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigError("HttpCheck.expected_status", status, "an HTTP status 100..599")
        if self.contains is not None and (not isinstance(self.contains, str) or not self.contains):
            raise ConfigError("HttpCheck.contains", self.contains, "a non-empty string or None")
        if not isinstance(self.method, str) or self.method.upper() not in _METHODS:
            raise ConfigError("HttpCheck.method", self.method, f"one of {sorted(_METHODS)}")
        object.__setattr__(self, "method", self.method.upper())
        if (
            isinstance(self.max_body_bytes, bool)
            or not isinstance(self.max_body_bytes, int)
            or (self.max_body_bytes < 1)
        ):
            raise ConfigError("HttpCheck.max_body_bytes", self.max_body_bytes, "an integer >= 1")
        check_timeout("HttpCheck", self.timeout_s)

    def _expected(self) -> dict[str, Scalar]:
        expected: dict[str, Scalar] = {"status": self.expected_status}
        if self.contains is not None:
            expected["contains"] = self.contains
        return expected

    def __call__(self) -> OutcomeReceipt:
        """Request the URL now; never raises (see :class:`~tripwire.verify.Verifier`)."""
        return run_check(
            kind=VerifierKind.HTTP,
            target=f"{self.method} {redact_url(self.url)}",
            checked_by="tripwire.verify.http",
            expected=self._expected(),
            timeout_s=self.timeout_s,
            clock=self.clock,
            body=self._check,
            secrets=self.headers.values(),
        )

    def _check(self, deadline: Deadline) -> Finding:
        # Async on this worker thread's own event loop: when the deadline passes, wait_for
        # cancels the request, which closes its socket, and the thread ends with it (a
        # blocking client would hold both until its own per-read timeouts ran out).
        return asyncio.run(self._acheck(deadline))

    async def _acheck(self, deadline: Deadline) -> Finding:
        try:
            return await asyncio.wait_for(self._request(), max(deadline.remaining(), 0.001))
        except asyncio.TimeoutError:
            raise TimeoutError("the request ran out of time") from None

    async def _request(self) -> Finding:
        httpx = require("httpx")
        async with (
            httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=self.follow_redirects) as c,
            c.stream(self.method, self.url, headers=dict(self.headers)) as response,
        ):
            observed: dict[str, Scalar] = {"status": response.status_code}
            passed = response.status_code == self.expected_status
            if self.contains is not None:
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    body.extend(chunk)
                    if len(body) >= self.max_body_bytes:
                        break
                text = bytes(body[: self.max_body_bytes]).decode(
                    response.encoding or "utf-8", errors="replace"
                )
                found = self.contains in text
                observed["contains"] = self.contains if found else None
                observed["body_bytes_read"] = min(len(body), self.max_body_bytes)
                passed = passed and found
        return Finding(passed, observed)
