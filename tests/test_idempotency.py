"""Idempotent side effects with the in-memory store."""

from __future__ import annotations

import threading

import pytest

from tripwire.idempotency import Idempotent, idempotent
from tripwire.store.memory import MemoryIdempotencyStore


def test_a_repeat_returns_the_first_result() -> None:
    sent: list[str] = []

    @idempotent()
    def send_email(to: str, body: str, timestamp: int = 0) -> dict[str, int]:
        sent.append(to)
        return {"n": len(sent)}

    first = send_email(to="a@x", body="hi", timestamp=1)
    again = send_email(to="a@x", body="hi", timestamp=2)  # volatile key: same operation
    other = send_email(to="b@x", body="hi")
    assert (first.status, first.value, first.replayed) == ("executed", {"n": 1}, False)
    assert (again.status, again.value, again.replayed) == ("already_sent", {"n": 1}, True)
    assert again.operation_id == first.operation_id
    assert other.status == "executed" and sent == ["a@x", "b@x"]


def test_explicit_operation_id_and_key_function() -> None:
    calls = []
    tool = Idempotent(lambda order: calls.append(order) or order, tool="refund")
    assert tool(1, operation_id="order-7").status == "executed"
    assert tool(2, operation_id="order-7").value == 1  # same id, other args: replayed
    keyed = Idempotent(lambda order, note: calls.append(order), key=lambda order, note: f"o{order}")
    keyed(5, note="a")
    assert keyed(5, note="b").status == "already_sent"
    assert calls == [1, 5]


def test_a_failed_action_can_be_retried() -> None:
    attempts = []

    def flaky(x: int) -> int:
        attempts.append(x)
        if len(attempts) == 1:
            raise ConnectionError("smtp down")
        return x

    tool = Idempotent(flaky)
    with pytest.raises(ConnectionError):
        tool(3)
    assert tool(3).status == "executed"
    assert tool(3).status == "already_sent"
    assert attempts == [3, 3]


def test_concurrent_callers_act_once() -> None:
    store = MemoryIdempotencyStore()
    started, release = threading.Event(), threading.Event()
    runs = []

    def charge(amount: int) -> str:
        runs.append(amount)
        started.set()
        release.wait(5)
        return "charged"

    tool = Idempotent(charge, store=store)
    results = []
    t = threading.Thread(target=lambda: results.append(tool(10)))
    t.start()
    started.wait(5)
    assert tool(10).status == "in_progress"
    release.set()
    t.join()
    assert results[0].status == "executed" and runs == [10]
    assert tool(10).value == "charged"


async def test_async_actions() -> None:
    sent = []

    @idempotent()
    async def post(url: str) -> str:
        sent.append(url)
        return "201"

    assert (await post("https://x/1")).status == "executed"
    assert (await post("https://x/1")).status == "already_sent"
    assert sent == ["https://x/1"]


def test_values_round_trip_as_json() -> None:
    tool = Idempotent(lambda: (1, 2), tool="pair")
    assert tool().value == (1, 2)
    assert tool().value == [1, 2]  # the replay is the stored JSON form
