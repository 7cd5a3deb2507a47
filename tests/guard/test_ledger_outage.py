"""The shared ledger becoming unreachable mid-run, against the real Redis (issue 16).

Redis is made unreachable without touching the shared server: the ledger talks to it through
a TCP proxy on loopback that the test closes (dropping every connection) and reopens.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import uuid
from typing import Any

import pytest

from tripwire.core.budget import Limits
from tripwire.core.reasons import StopReason
from tripwire.errors import BudgetExceeded
from tripwire.guard import Guard

pytestmark = pytest.mark.redis

redis_store = pytest.importorskip("tripwire.store.redis")


class Proxy:
    """A TCP proxy from a loopback port to Redis that can be closed and reopened."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 6379)) -> None:
        self.target = target
        self.port = 0
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def open(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def close(self) -> None:
        """Refuse new connections and cut every open one."""
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (Linux)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target)
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proxy(redis_client: Any) -> Any:
    p = Proxy()
    p.open()
    yield p
    p.close()


def test_fail_open_holds_the_cap_per_process_and_reconciles(
    redis_client: Any, redis_prefix: str, proxy: Proxy
) -> None:
    clock = FakeClock()
    ledger = redis_store.RedisLedger(
        url=proxy.url, prefix=redis_prefix, on_unavailable="fail_open", timeout_s=0.5,
        retry_after_s=5.0, clock=clock, outage_share=1.0,  # the whole rest: the cap alone holds
    )
    guard = Guard(Limits(max_tool_calls=50), loop_policy=None, ledger=ledger, run_id="job-1")
    key = f"{redis_prefix}:{{job-1}}:tool_calls"
    for i in range(20):
        guard.before_tool("search", {"i": i})
    assert int(redis_client.get(key)) == 20

    proxy.close()  # a Redis outage, as this process sees it
    allowed = 20
    with pytest.raises(BudgetExceeded) as info:
        for i in range(20, 200):
            guard.before_tool("search", {"i": i})
            allowed += 1
    assert allowed == 50  # the local count started from the 20 already spent
    assert info.value.reason is StopReason.MAX_TOOL_CALLS
    assert info.value.counters.tool_calls == 50
    assert int(redis_client.get(key)) == 20  # Redis has not seen the local 30 yet

    proxy.open()  # Redis answers again; the next call after retry_after_s reconciles
    clock.now += 6
    assert guard.snapshot().counters.tool_calls == 50
    assert int(redis_client.get(key)) == 50
    assert ledger.reconciled == 1
    receipt = guard.receipt("searcher")
    assert receipt.counters.tool_calls == 50 and receipt.reason is StopReason.MAX_TOOL_CALLS


def test_fail_open_usage_spent_during_the_outage_reaches_redis(
    redis_client: Any, redis_prefix: str, proxy: Proxy
) -> None:
    clock = FakeClock()
    ledger = redis_store.RedisLedger(
        url=proxy.url, prefix=redis_prefix, timeout_s=0.5, retry_after_s=5.0, clock=clock
    )
    guard = Guard(Limits(max_total_tokens=1000), loop_policy=None, ledger=ledger, prices=None)
    guard.record_usage(input_tokens=300, output_tokens=0)
    proxy.close()
    guard.record_usage(input_tokens=300, output_tokens=0)
    with pytest.raises(BudgetExceeded) as info:  # 1000: the limit holds in the outage
        guard.record_usage(input_tokens=400, output_tokens=0)
    assert info.value.observed == 1000
    proxy.open()
    clock.now += 6
    assert guard.snapshot().counters.input_tokens == 1000
    key = f"{redis_prefix}:{{{guard.run_id}}}:input_tokens"
    assert int(redis_client.get(key)) == 1000


def test_fail_closed_stops_with_the_real_counters_and_a_receipt(
    redis_client: Any, redis_prefix: str, proxy: Proxy
) -> None:
    from tripwire.core.receipt import EndKind

    ledger = redis_store.RedisLedger(
        url=proxy.url, prefix=redis_prefix, on_unavailable="fail_closed", timeout_s=0.5
    )
    guard = Guard(
        Limits(max_tool_calls=50, max_total_tokens=100_000), loop_policy=None, ledger=ledger,
        prices=None,
    )
    for i in range(7):
        guard.before_step()
        guard.record_usage(input_tokens=100, output_tokens=10)
        guard.before_tool("search", {"i": i})
    proxy.close()
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("search", {"i": 7})
    exc = info.value
    assert exc.reason is StopReason.MAX_TOOL_CALLS and exc.limit == 50
    assert exc.observed == 7
    assert "fail_closed" in str(exc)
    assert exc.counters.tool_calls == 7 and exc.counters.total_tokens == 770
    receipt = guard.receipt("searcher")  # must not raise
    assert receipt.end is EndKind.STOP_CONDITION
    assert receipt.counters.tool_calls == 7 and receipt.counters.input_tokens == 700
    assert receipt.condition == {"tool_calls": 7, "max_tool_calls": 50}


def test_fail_closed_with_no_cap_at_stake_goes_on(
    redis_client: Any, redis_prefix: str, proxy: Proxy
) -> None:
    ledger = redis_store.RedisLedger(
        url=proxy.url, prefix=f"{redis_prefix}:{uuid.uuid4().hex}", on_unavailable="fail_closed",
        timeout_s=0.5,
    )
    guard = Guard(loop_policy=None, ledger=ledger, prices=None)
    guard.before_tool("search", {"i": 1})
    proxy.close()
    guard.before_tool("search", {"i": 2})  # nothing to enforce: counted locally
    guard.record_usage(input_tokens=5)
    snap = guard.snapshot()
    assert snap.counters.tool_calls == 2 and snap.counters.input_tokens == 5
    assert guard.reason is None


def test_in_an_outage_a_process_spends_only_its_share_of_what_was_left(
    redis_client: Any, redis_prefix: str, proxy: Proxy
) -> None:
    # Eight processes sharing max_tool_calls=2000 once spent 8,073 calls across three 0.3 s
    # Redis stalls: each could spend all that was left alone. Now each may spend its share.
    clock = FakeClock()
    ledgers = [
        redis_store.RedisLedger(url=proxy.url, prefix=redis_prefix, timeout_s=0.5, retry_after_s=5.0, clock=clock)
        for _ in range(8)
    ]
    guards = [Guard(Limits(max_tool_calls=2000), loop_policy=None, ledger=ledger, run_id="shared") for ledger in ledgers]
    key = f"{redis_prefix}:{{shared}}:tool_calls"
    for i in range(1000):  # half the budget spent while Redis answers, by all eight
        guards[i % 8].before_tool("search", {"i": i})
    assert int(redis_client.get(key)) == 1000
    proxy.close()  # a stall, as all eight see it
    ran = [0] * 8
    for n, guard in enumerate(guards):
        with pytest.raises(BudgetExceeded) as info:
            for i in range(2000):
                guard.before_tool("search", {"n": n, "i": i})
                ran[n] += 1
        assert "outage_share" in str(info.value)  # the stop says why: not the cap itself
    # Each process reserved 10% of the 1,000 it last saw left (its own last view: up to 7
    # calls older than the shared total), never all of it.
    assert all(100 <= r <= 101 for r in ran), ran
    proxy.open()
    clock.now += 6
    for guard in guards:
        guard.snapshot()  # each reconciles its local spend
    total = int(redis_client.get(key))
    assert total == 1000 + sum(ran) <= 2000 * 1.5  # at most 8 x 10% of what was left over it
    receipt = guards[0].receipt("searcher")
    assert receipt.counters.tool_calls == total
