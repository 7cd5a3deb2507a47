"""Deadlines on the connections ``tripwire serve`` accepts, below the app: a client must send a
request's whole head (its request line and headers) within ``header_timeout_s`` of connecting
or of its previous answer, else the connection is closed.

uvicorn has a keep-alive timeout, but it restarts at every byte received: a client that dribbles
a header a byte a second, or sends half a head and stops, held its connection (and the server's
memory for it) for as long as it liked; 1,500 of them without a token were all held open. The
body's own deadline is the app's (``ServeConfig.body_timeout_s``): only a request that passed
authentication gets that far.

The protocol is uvicorn's HTTP/1.1 protocol on h11 with one more timer; pass
:func:`http_protocol` as ``uvicorn.Config(http=...)``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "http_protocol"]

DEFAULT_HEADER_TIMEOUT_S: Final = 10.0


class _HeadDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose next request head is late.

    The timer runs from the connection's start and from each answer, and stops when a new
    request's head is in (uvicorn then starts a new request cycle). After an answer given
    without reading the body (a 401, say), the client's still-arriving body counts as late.
    """

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._armed_for: Any = None
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._armed_for = self.cycle  # None before the first request
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_late)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self.cycle is self._armed_for and not self.transport.is_closing():
            self.transport.close()  # no new request came: nothing to answer

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.cycle is not self._armed_for:
            self._disarm()  # a new request's head is in (its body has the app's deadline)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is not None and self.cycle.response_complete:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def http_protocol(header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S) -> Any:
    """The protocol class for ``uvicorn.Config(http=...)``, with this head deadline."""
    return type("TripwireH11Protocol", (_HeadDeadline,), {"header_timeout_s": float(header_timeout_s)})
