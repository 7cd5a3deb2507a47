"""A local HTTP server that records every request it receives (an alert peer we can run)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorder:
    url: str
    requests: list[tuple[str, Any]] = field(default_factory=list)
    fail_first: int = 0
    """Answer 500 to this many requests before accepting."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str | None = None) -> list[Any]:
        with self.lock:
            return [b for p, b in self.requests if path is None or p == path]


@contextlib.contextmanager
def recorder(fail_first: int = 0) -> Iterator[Recorder]:
    state: dict[str, Recorder] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            rec = state["rec"]
            with rec.lock:
                rec.requests.append((self.path, body))
                failing = rec.fail_first > 0
                if failing:
                    rec.fail_first -= 1
            self.send_response(500 if failing else 202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state["rec"] = Recorder(url=f"http://127.0.0.1:{server.server_address[1]}", fail_first=fail_first)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state["rec"]
    finally:
        server.shutdown()
        server.server_close()
