"""HttpCheck against a real local HTTP server."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tripwire.core.receipt import VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify import HttpCheck
from tripwire.verify._http import redact_url

from .conftest import LocalServer

T0 = 1_700_000_000.0


def clock() -> float:
    return T0


def test_serves_the_new_version(http_server: LocalServer) -> None:
    receipt = HttpCheck(url=f"{http_server.base_url}/version", contains="1.4.2", clock=clock)()
    assert receipt.passed is True, receipt.error
    assert receipt.kind is VerifierKind.HTTP
    assert receipt.checked_at == T0
    assert receipt.observed == {"status": 200, "contains": "1.4.2", "body_bytes_read": 20}
    assert receipt.expected == {"status": 200, "contains": "1.4.2"}


def test_old_version_fails(http_server: LocalServer) -> None:
    receipt = HttpCheck(url=f"{http_server.base_url}/old", contains="1.4.2", clock=clock)()
    assert receipt.passed is False
    assert receipt.error is None
    assert receipt.observed["status"] == 200
    assert receipt.observed["contains"] is None


def test_status_must_match(http_server: LocalServer) -> None:
    gone = f"{http_server.base_url}/gone"
    assert HttpCheck(url=gone, clock=clock)().observed["status"] == 404
    assert HttpCheck(url=gone, clock=clock)().passed is False
    assert HttpCheck(url=gone, expected_status=404, clock=clock)().passed is True


def test_redirect_is_followed_by_default(http_server: LocalServer) -> None:
    url = f"{http_server.base_url}/redirect"
    assert HttpCheck(url=url, contains="1.4.2", clock=clock)().passed is True
    no_follow = HttpCheck(url=url, follow_redirects=False, clock=clock)()
    assert no_follow.observed["status"] == 302
    assert no_follow.passed is False


def test_slow_endpoint_times_out(http_server: LocalServer) -> None:
    started = time.monotonic()
    receipt = HttpCheck(url=f"{http_server.base_url}/slow", timeout_s=0.3, clock=clock)()
    assert receipt.passed is False
    assert receipt.error is not None
    assert time.monotonic() - started < 2


def test_unreachable_host_is_a_failed_receipt(closed_port: int) -> None:
    receipt = HttpCheck(url=f"http://127.0.0.1:{closed_port}/version", clock=clock)()
    assert receipt.passed is False
    assert receipt.error is not None
    assert receipt.error.startswith("ConnectError")


def test_credentials_and_query_are_not_recorded(http_server: LocalServer) -> None:
    host = http_server.base_url.removeprefix("http://")
    receipt = HttpCheck(url=f"http://user:pa55word@{host}/version?token=tok-123", clock=clock)()
    assert receipt.passed is True, receipt.error
    assert receipt.target == f"GET http://{host}/version?…"
    text = json.dumps(receipt.to_dict())
    for secret in ("pa55word", "tok-123"):
        assert secret not in text


def test_headers_are_sent_but_not_recorded(http_server: LocalServer) -> None:
    receipt = HttpCheck(
        url=f"{http_server.base_url}/version",
        headers={"Authorization": "Bearer sk-header-secret"},
        clock=clock,
    )()
    assert receipt.passed is True, receipt.error
    assert "sk-header-secret" not in json.dumps(receipt.to_dict())
    assert http_server.requests[-1]["headers"]["Authorization"] == "Bearer sk-header-secret"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "ftp://x/y"}, "HttpCheck.url"),
        ({"url": "http://x/", "expected_status": 42}, "HttpCheck.expected_status"),
        ({"url": "http://x/", "method": "BREW"}, "HttpCheck.method"),
        ({"url": "http://x/", "contains": ""}, "HttpCheck.contains"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        HttpCheck(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


# --- issue 16: a call documented never to raise, and a timeout that leaves nothing behind ------


def test_a_port_out_of_range_is_refused_when_built_and_never_raises_later() -> None:
    with pytest.raises(ConfigError) as info:
        HttpCheck(url="http://127.0.0.1:99999/version")
    assert info.value.field == "HttpCheck.url"
    assert "port" in info.value.expected
    assert redact_url("http://user:pw@127.0.0.1:99999/v?t=1") == "http://127.0.0.1:?/v?…"


class DrippingServer:
    """Answers 200 and then sends one body byte every 50 ms, forever (until the peer closes)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.closed_by_peer = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.server.accept()
        conn.recv(65536)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
            while True:
                conn.sendall(b"x")
                time.sleep(0.05)
        except OSError:
            self.closed_by_peer.set()
        finally:
            conn.close()
            self.server.close()


def verify_threads(kind: str) -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == f"tripwire-verify-{kind}"}


def test_a_timed_out_check_leaves_no_thread_or_socket_behind() -> None:
    server = DrippingServer()
    before = verify_threads("http")
    receipt = HttpCheck(
        url=f"http://127.0.0.1:{server.port}/version", contains="1.4.2", timeout_s=0.3, clock=clock
    )()
    assert receipt.passed is False
    assert receipt.error == "timed out after 0.3 s"
    assert {t for t in verify_threads("http") - before if t.is_alive()} == set()
    # The socket was closed: the server's next write failed (waits at most 5 s, never times).
    assert server.closed_by_peer.wait(5)


def test_a_url_that_does_not_parse_is_a_config_error_naming_the_field() -> None:
    from tripwire.errors import ConfigError
    from tripwire.verify._http import redact_url

    with pytest.raises(ConfigError) as caught:
        HttpCheck(url="http://[::1/x")
    assert caught.value.field == "HttpCheck.url" and "parses" in str(caught.value)
    assert redact_url("http://[::1/x") == "<unparsable URL>"
