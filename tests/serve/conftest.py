"""Fixtures for the fleet service: a real ``tripwire serve`` app on uvicorn, on loopback.

The server runs in a thread of the test process (``uvicorn.Server``) on a free port; clients
are real HTTP clients (httpx, the stock OTLP exporter). The store is a fresh SQLite file per
test unless a test asks for PostgreSQL.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from tripwire.serve import ServeConfig, Service, create_app
from tripwire.serve.connections import http_protocol
from tripwire.store.runs import RunStore

TOKEN = "test-token-0123456789abcdef"


def free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Running:
    url: str
    service: Service
    store: RunStore
    server: Any

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


@contextlib.contextmanager
def running_service(config: ServeConfig, store: RunStore) -> Iterator[Running]:
    import uvicorn

    service = Service(config, store=store)
    app = create_app(config, service=service)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="on",
            http=http_protocol(config.header_timeout_s),  # as tripwire serve runs it
            timeout_graceful_shutdown=5,  # a browser's keep-alive connection must not hold it
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not (server.started and service.started.is_set()):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield Running(url=f"http://127.0.0.1:{port}", service=service, store=store, server=server)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        if thread.is_alive():
            # A server whose loop never ends leaves its thread-pool worker (not a daemon)
            # behind, and the test process then never exits: stop it hard, and say so.
            server.force_exit = True
            thread.join(timeout=15)
            assert not thread.is_alive(), "the test server did not stop within 30 s"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[RunStore]:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    yield store
    store.dispose()


@pytest.fixture
def service(sqlite_store: RunStore) -> Iterator[Running]:
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05)
    with running_service(config, sqlite_store) as running:
        yield running
