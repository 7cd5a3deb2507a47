"""Slow and half-sent requests cannot starve the receiver: a request head must arrive within
``header_timeout_s`` (else the connection is closed, token or none), a body within
``body_timeout_s`` (else 408), and only a request whose body is in counts against
``max_inflight``. Real sockets against a real uvicorn serving the app as ``tripwire serve`` does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tripwire.serve import ServeConfig
from tripwire.store.runs import RunStore

from .conftest import TOKEN, Running, running_service
from .otlp_helpers import loop_spans, protobuf_body

PB = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[Running]:
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    config = ServeConfig(tokens=(TOKEN,), reorder_s=0.0, flush_s=0.05, header_timeout_s=0.5, body_timeout_s=1.0)
    with running_service(config, store) as r:
        yield r
    store.dispose()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``s`` within ``seconds`` (reading whatever it sends first)."""
    s.settimeout(seconds)
    try:
        while s.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_stalled_uploads_hold_no_slot_and_get_408(strict: Running) -> None:
    stalled = []
    for _ in range(6):  # more than max_inflight (4)
        s = _connect(strict.url)
        s.sendall(
            b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: 100000\r\n\r\n".encode()
            + b"\x0a" * 10  # ten bytes of the promised body, then nothing
        )
        stalled.append(s)
    # While they stall, another exporter's request is taken at once.
    got = httpx.post(f"{strict.url}/v1/traces", content=protobuf_body(loop_spans(2)), headers=PB, timeout=10)
    assert got.status_code == 200, got.text
    # Each stalled upload gets 408 once its body is late, and its connection is closed.
    for s in stalled:
        s.settimeout(10)
        answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
        assert _closed_within(s, 5)
        s.close()


def test_a_request_head_that_never_ends_is_closed_token_or_none(strict: Running) -> None:
    heads = [
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n",  # no token yet, and never the end of the head
        # A whole head without a token, and a body that never ends: answered 401, then closed.
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nabc",
        b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n",
        b"",  # connected, nothing sent
    ]
    opened = []
    for head in heads * 20:
        s = _connect(strict.url)
        if head:
            s.sendall(head)
        opened.append(s)
    # Dribbling a header byte by byte does not keep a connection open either.
    dribbler = _connect(strict.url)
    dribbler.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
    deadline = time.monotonic() + 5
    closed = False
    while time.monotonic() < deadline:
        try:
            dribbler.sendall(b"a")
        except OSError:
            closed = True
            break
        if _closed_within(dribbler, 0.1):
            closed = True
            break
    assert closed, "a header sent a byte at a time held its connection for 5 s"
    for s in opened:
        assert _closed_within(s, 5)
        s.close()
    dribbler.close()
    # The receiver answers on, and a keep-alive client that is quick is untouched.
    with httpx.Client(base_url=strict.url) as client:
        for _ in range(3):
            assert client.get("/healthz").status_code == 200
            time.sleep(0.2)
