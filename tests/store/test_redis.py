"""Redis ledger and idempotency store against the real Redis on 127.0.0.1:6379."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import socket
import threading
import uuid
from typing import Any

import pytest

from tripwire.core.budget import Limits
from tripwire.core.reasons import StopReason
from tripwire.errors import BudgetExceeded, RunStopped
from tripwire.guard import Guard
from tripwire.idempotency import Idempotent
from tripwire.store.base import Reservation, StoreUnavailable

pytestmark = pytest.mark.redis

redis_store = pytest.importorskip("tripwire.store.redis")
RedisLedger = redis_store.RedisLedger
RedisIdempotencyStore = redis_store.RedisIdempotencyStore

CLOSED = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def _spend(prefix: str, run_id: str, cap: int, out: Any) -> None:
    """One agent process: spend tool calls from the shared budget until refused."""
    ledger = RedisLedger(prefix=prefix, timeout_s=2.0)
    guard = Guard(Limits(max_tool_calls=cap), loop_policy=None, ledger=ledger, run_id=run_id)
    allowed = 0
    for i in range(cap):
        try:
            guard.before_tool("search", {"i": i})
        except BudgetExceeded as exc:
            assert exc.reason is StopReason.MAX_TOOL_CALLS
            break
        allowed += 1
    out.put(allowed)


def test_processes_share_one_budget(redis_client: Any, redis_prefix: str) -> None:
    cap, workers = 60, 6
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_spend, args=(redis_prefix, "run-1", cap, out)) for _ in range(workers)
    ]
    for p in procs:
        p.start()
    totals = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sum(totals) == cap  # exactly the cap in total, never more
    assert int(redis_client.get(f"{redis_prefix}:{{run-1}}:tool_calls")) == cap


def test_atomic_reserve_all_or_nothing(redis_client: Any, redis_prefix: str) -> None:
    ledger = RedisLedger(redis_client, prefix=redis_prefix)
    assert ledger.reserve([("a", 2, 3), ("b", 1, None)]) == Reservation(totals=(2, 1))
    refused = ledger.reserve([("b", 5, None), ("a", 2, 3)])  # a would be 4 > 3
    assert refused == Reservation(totals=(1, 2), refused=1) and not refused.granted
    assert ledger.get(["a", "b", "never"]) == [2, 1, 0]
    assert ledger.add([("a", 10), ("c", 1)]) == [12, 1]
    assert int(redis_client.ttl(f"{redis_prefix}:a")) > 0


def test_parent_and_child_over_redis(redis_client: Any, redis_prefix: str) -> None:
    ledger = RedisLedger(redis_client, prefix=redis_prefix)
    parent = Guard(Limits(max_tool_calls=3), loop_policy=None, ledger=ledger)
    child = parent.subagent(Limits(max_tool_calls=10))
    for i in range(3):
        child.before_tool("t", {"i": i})
    with pytest.raises(BudgetExceeded) as info:
        child.before_tool("t", {"i": 3})
    assert info.value.limit == 3
    assert parent.snapshot().counters.tool_calls == 3


def test_cost_over_redis(redis_client: Any, redis_prefix: str) -> None:
    ledger = RedisLedger(redis_client, prefix=redis_prefix)
    a = Guard(Limits(max_cost_usd=0.10), loop_policy=None, ledger=ledger, run_id="shared")
    b = Guard(Limits(max_cost_usd=0.10), loop_policy=None, ledger=ledger, run_id="shared")
    a.record_usage(input_tokens=1, cost_usd=0.06)
    with pytest.raises(BudgetExceeded) as info:
        b.record_usage(input_tokens=1, cost_usd=0.05)
    assert info.value.reason is StopReason.MAX_COST
    assert info.value.observed == pytest.approx(0.11)


def test_unreachable_fail_open_counts_locally_and_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger = RedisLedger(
        url=CLOSED, prefix=f"t:{uuid.uuid4().hex}", on_unavailable="fail_open", outage_share=1.0
    )
    guard = Guard(Limits(max_tool_calls=3), loop_policy=None, ledger=ledger)
    with caplog.at_level(logging.WARNING, logger="tripwire.store.redis"):
        for i in range(3):
            guard.before_tool("t", {"i": i})
        with pytest.raises(BudgetExceeded) as info:  # still enforced, locally
            guard.before_tool("t", {"i": 9})
    assert info.value.reason is StopReason.MAX_TOOL_CALLS
    warnings = [r for r in caplog.records if "fail_open" in r.getMessage()]
    assert len(warnings) == 1
    assert ledger.failures >= 1


def test_unreachable_fail_closed_stops_the_run() -> None:
    ledger = RedisLedger(url=CLOSED, prefix=f"t:{uuid.uuid4().hex}", on_unavailable="fail_closed")
    guard = Guard(Limits(max_tool_calls=3), loop_policy=None, ledger=ledger)
    with pytest.raises(BudgetExceeded) as info:
        guard.before_tool("t", {"i": 1})
    assert info.value.reason is StopReason.MAX_TOOL_CALLS
    assert info.value.limit == 3
    assert "fail_closed" in str(info.value)
    with pytest.raises(StoreUnavailable):
        ledger.get(["x"])


def test_idempotency_over_redis(redis_client: Any, redis_prefix: str) -> None:
    store = RedisIdempotencyStore(redis_client, prefix=redis_prefix)
    sent: list[str] = []

    def send_email(to: str) -> dict[str, str]:
        sent.append(to)
        return {"id": f"msg-{len(sent)}"}

    tool = Idempotent(send_email, store=store)
    first = tool(to="a@example.com")
    again = Idempotent(send_email, store=RedisIdempotencyStore(redis_client, prefix=redis_prefix))(
        to="a@example.com"
    )
    assert first.status == "executed" and again.status == "already_sent"
    assert again.value == {"id": "msg-1"} and sent == ["a@example.com"]


def test_idempotency_store_unreachable_fails_closed() -> None:
    tool = Idempotent(lambda to: to, store=RedisIdempotencyStore(url=CLOSED), tool="send_email")
    with pytest.raises(RunStopped) as info:
        tool(to="a@example.com")
    assert info.value.reason is StopReason.TOOL_ERROR


# --- issue 16: Redis fails after the action ran --------------------------------------------------


class CuttableProxy:
    """A TCP forwarder to the real Redis whose connections can be cut (a network fault)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 6379)) -> None:
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.down = threading.Event()
        self.socks: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            if self.down.is_set():
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.close()

    def cut(self) -> None:
        self.down.set()
        with self.lock:
            socks, self.socks = self.socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def restore(self) -> None:
        self.down.clear()

    def close(self) -> None:
        self.cut()
        self.server.close()


@pytest.fixture
def proxy() -> Any:
    p = CuttableProxy()
    yield p
    p.close()


def test_redis_lost_after_the_action_is_retried_and_never_says_not_running(
    redis_client: Any, redis_prefix: str, proxy: CuttableProxy
) -> None:
    store = RedisIdempotencyStore(url=proxy.url, prefix=redis_prefix, timeout_s=0.2)
    sent: list[str] = []

    def send_email(to: str) -> dict[str, str]:
        sent.append(to)
        proxy.cut()  # Redis goes away (a restart, a network blip) after the e-mail went out
        threading.Timer(0.3, proxy.restore).start()
        return {"id": "msg-1"}

    tool = Idempotent(send_email, store=store, record_wait_s=10)
    first = tool(to="a@example.com")  # no RunStopped("... not running ..."): it ran
    assert (first.status, first.value) == ("executed", {"id": "msg-1"})
    assert redis_client.get(f"{redis_prefix}:{first.operation_id}") == b'd{"id":"msg-1"}'
    again = Idempotent(send_email, store=RedisIdempotencyStore(redis_client, prefix=redis_prefix))
    assert again(to="a@example.com").value == {"id": "msg-1"}
    assert sent == ["a@example.com"]


def test_redis_down_for_longer_than_the_wait_keeps_the_result_for_later(
    redis_client: Any, redis_prefix: str, proxy: CuttableProxy, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisIdempotencyStore(url=proxy.url, prefix=redis_prefix, timeout_s=0.2)
    sent: list[str] = []

    def send_email(to: str) -> dict[str, str]:
        sent.append(to)
        proxy.cut()
        return {"id": f"msg-{len(sent)}"}

    tool = Idempotent(send_email, store=store, record_wait_s=0.2)
    with caplog.at_level(logging.WARNING, logger="tripwire.idempotency"):
        first = tool(to="a@example.com")
    assert (first.status, first.value) == ("executed", {"id": "msg-1"})
    assert "ran, but its result could not be recorded" in caplog.text
    assert "not running" not in caplog.text
    key = f"{redis_prefix}:{first.operation_id}"
    assert redis_client.get(key) == b"p"  # claimed; the result is held in this process
    replay = tool(to="a@example.com")  # Redis still unreachable: replayed from memory
    assert (replay.status, replay.value) == ("already_sent", {"id": "msg-1"})
    with pytest.raises(RunStopped):  # a new operation cannot be claimed meanwhile
        tool(to="b@example.com")
    proxy.restore()
    tool(to="c@example.com")  # the store answers: the held record is written first
    assert redis_client.get(key) == b'd{"id":"msg-1"}'
    assert sent == ["a@example.com", "c@example.com"]


def test_a_claim_that_cannot_reach_redis_says_it_did_not_run(proxy: CuttableProxy) -> None:
    runs: list[str] = []
    tool = Idempotent(
        lambda to: runs.append(to),
        store=RedisIdempotencyStore(url=proxy.url, timeout_s=0.2),
        tool="send_email",
    )
    proxy.cut()
    with pytest.raises(RunStopped) as info:
        tool(to="a@example.com")
    assert "cannot be checked; not running it now" in str(info.value)
    assert runs == []
