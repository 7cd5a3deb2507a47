"""Real services for the verifier tests: PostgreSQL, a local HTTP server, a fake judge.

Service rule: when PostgreSQL is unreachable, its tests skip with a loud reason on a
developer machine, and FAIL under ``CI=true``: CI must never pass by skipping them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

T0 = 1_700_000_000.0

POSTGRES_DSN = os.environ.get(
    "TRIPWIRE_TEST_POSTGRES_DSN", "host=127.0.0.1 port=5432 dbname=test user=postgres"
)
POSTGRES_URL = os.environ.get(
    "TRIPWIRE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def fixed_clock() -> float:
    """The clock every verifier test injects."""
    return T0


def _service_missing(what: str, exc: BaseException) -> None:
    message = f"{what} is unreachable ({type(exc).__name__}: {exc})"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message}; CI must start it (never skip service tests in CI)", pytrace=False)
    pytest.skip(f"!!! SKIPPED, NOT TESTED: {message}; start it to run these tests")


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A SQLAlchemy URL of the real PostgreSQL test database (trust auth)."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # any failure means: no usable database here
        _service_missing("PostgreSQL at 127.0.0.1:5432 (database test, user postgres)", exc)
    return POSTGRES_URL


@pytest.fixture
def pg_table(postgres_url: str) -> Iterator[str]:
    """A uniquely named invoices table with one row, dropped afterwards."""
    import psycopg

    name = f"tw_receipt_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (number text PRIMARY KEY, status text, "
            "total numeric(10, 2), sent_at timestamp)"
        )
        conn.execute(
            f"INSERT INTO {name} VALUES ('INV-0042', 'sent', 120.50, '2024-06-01 12:30:00')"
        )
    try:
        yield name
    finally:
        with psycopg.connect(POSTGRES_DSN, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {name}")


@dataclass
class LocalServer:
    """State of the local HTTP server: what it answers on the judge route, what it received."""

    base_url: str = ""
    judge_reply: str = '{"done": true, "confidence": 0.9, "reason": "the report was sent"}'
    judge_status: int = 200
    requests: list[dict[str, Any]] = field(default_factory=list)


def _handler(state: LocalServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes, ctype: str = "text/plain") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self, body: Any = None) -> None:
            state.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body,
                }
            )

        def do_GET(self) -> None:
            self._record()
            path = self.path.split("?", 1)[0]
            if path == "/version":
                self._send(200, b"service build 1.4.2\n")
            elif path == "/old":
                self._send(200, b"service build 1.4.1\n")
            elif path == "/redirect":
                self.send_response(302)
                self.send_header("Location", "/version")
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif path == "/slow":
                time.sleep(3)
                self._send(200, b"late 1.4.2")
            else:
                self._send(404, b"not found")

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            self._record(body)
            if self.path == "/slow/v1/chat/completions":
                time.sleep(3)
            if self.path.endswith("/v1/chat/completions"):
                if state.judge_status != 200:
                    self._send(state.judge_status, b'{"error": "echo of the prompt"}')
                    return
                answer = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": state.judge_reply},
                            "finish_reason": "stop",
                        }
                    ],
                }
                self._send(200, json.dumps(answer).encode(), "application/json")
            else:
                self._send(404, b"not found")

    return Handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that timed out on /slow closed its socket before the late answer.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@pytest.fixture
def http_server() -> Iterator[LocalServer]:
    """A real HTTP server on 127.0.0.1 (ephemeral port), in a thread."""
    state = LocalServer()
    server = _QuietServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A local port nothing listens on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
