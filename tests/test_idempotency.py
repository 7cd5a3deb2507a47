"""Idempotent side effects with the in-memory store."""

from __future__ import annotations

import threading
from typing import Any

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


# --- issue 16: acting twice, losing a result ---------------------------------------------------


class Interrupt(BaseException):
    """Like KeyboardInterrupt or SystemExit: not an Exception (and it does not end pytest)."""


def test_an_interrupt_after_the_action_keeps_it_in_progress() -> None:
    sent: list[str] = []

    def send(to: str) -> str:
        sent.append(to)
        raise Interrupt  # after the side effect: it may have acted

    tool = Idempotent(send)
    with pytest.raises(Interrupt):
        tool("a@x")
    again = tool("a@x")
    assert again.status == "in_progress" and again.value is None
    assert sent == ["a@x"]  # never run twice


async def test_an_async_tool_cancelled_by_the_guard_timeout_is_not_run_again() -> None:
    import asyncio

    from tripwire.core.budget import Limits
    from tripwire.errors import BudgetExceeded
    from tripwire.guard import Guard

    transfers: list[int] = []

    @idempotent()
    async def transfer(amount: int) -> str:
        transfers.append(amount)  # the money moved
        await asyncio.sleep(5)  # the confirmation is slow
        return "ok"

    guard = Guard(Limits(tool_timeout_s=0.05), loop_policy=None)
    with pytest.raises(BudgetExceeded):
        await guard.atimeout(transfer(100))
    retry = await transfer(100)
    assert retry.status == "in_progress"
    assert transfers == [100]


@pytest.mark.parametrize(
    "make",
    [
        lambda: 10**5000,  # too large to print
        lambda: {"note": "\ud800"},  # a lone surrogate
        lambda: (lambda a: a.append(a) or a)([]),  # a cycle
    ],
    ids=["huge-int", "lone-surrogate", "cycle"],
)
def test_a_result_that_cannot_be_encoded_still_completes_the_record(make: Any) -> None:
    store = MemoryIdempotencyStore()
    runs: list[int] = []

    def act() -> Any:
        runs.append(1)
        return make()

    tool = Idempotent(act, store=store, tool="act")
    first = tool()
    assert first.status == "executed"
    again = tool()
    assert (again.status, again.value, again.value_stored) == ("already_sent", None, False)
    assert runs == [1]


def nested(depth: int, leaf: object) -> object:
    value: object = leaf
    for _ in range(depth):
        value = {"to": value}
    return value


def test_payloads_that_differ_only_deep_down_are_different_operations() -> None:
    moved: list[object] = []
    tool = Idempotent(lambda payload: moved.append(payload), tool="transfer")
    a, b = nested(70, {"account": "A", "amount": 10}), nested(70, {"account": "B", "amount": 10})
    assert tool.operation_id(a) != tool.operation_id(b)
    assert tool(a).status == "executed" and tool(b).status == "executed"
    assert len(moved) == 2
    assert tool.operation_id(nested(70, {"account": "A", "amount": 10})) == tool.operation_id(a)


def test_volatile_keys_are_dropped_at_every_depth_and_1_equals_1_0() -> None:
    tool = Idempotent(lambda payload: None, tool="t")
    deep = nested(80, {"x": 1, "request_id": "r-1"})
    assert tool.operation_id(deep) == tool.operation_id(nested(80, {"x": 1.0, "request_id": 9}))
    assert tool.operation_id({"x": 1}) != tool.operation_id({"x": "1"})
    assert tool.operation_id([1, 2]) != tool.operation_id([[1, 2]])
    assert tool.operation_id({1: "a"}) != tool.operation_id({"1": "a"})


def test_positional_and_keyword_calls_are_one_operation() -> None:
    def send(to: str, subject: str = "Hi") -> None: ...

    tool = Idempotent(send)
    assert tool.operation_id("a@x") == tool.operation_id(to="a@x", subject="Hi")
    assert tool.operation_id("a@x") != tool.operation_id("a@x", "Bye")


class Account:
    """No __str__ or __repr__ of its own: str() holds a memory address."""

    def __init__(self, number: str) -> None:
        self.number = number


class Hostile:
    def __str__(self) -> str:
        raise RuntimeError("no")


@pytest.mark.parametrize("bad", [Account("1"), Hostile(), {"nested": [Account("2")]}])
def test_an_argument_without_a_stable_identity_is_refused_before_acting(bad: object) -> None:
    from tripwire.errors import ConfigError

    runs: list[object] = []
    tool = Idempotent(lambda account: runs.append(account), tool="charge")
    with pytest.raises(ConfigError) as info:
        tool(bad)
    assert "operation_id=" in str(info.value) and "key=" in str(info.value)
    assert runs == []
    assert tool(bad, operation_id="charge-1").status == "executed"  # an explicit id works


def test_a_cycle_or_extreme_nesting_in_the_arguments_is_refused() -> None:
    from tripwire.errors import ConfigError

    tool = Idempotent(lambda payload: None, tool="t")
    cyclic: list[object] = []
    cyclic.append(cyclic)
    with pytest.raises(ConfigError, match="cycle"):
        tool.operation_id(cyclic)
    with pytest.raises(ConfigError, match="deeper"):
        tool.operation_id(nested(500, 1))


ID_SCRIPT = """
import dataclasses, decimal, enum, pathlib, sys, uuid
from tripwire.idempotency import Idempotent

class Color(enum.Enum):
    RED = "red"

@dataclasses.dataclass
class Order:
    items: frozenset
    total: decimal.Decimal
    color: Color
    path: pathlib.PurePosixPath
    ref: uuid.UUID

order = Order(frozenset({"apple", "pear", "fig", "kiwi", "plum"}), decimal.Decimal("10.50"),
              Color.RED, pathlib.PurePosixPath("/out/a.pdf"),
              uuid.UUID("12345678-1234-5678-1234-567812345678"))
print(Idempotent(lambda order, tags: None, tool="ship").operation_id(order, {"b", "a", "c"}))
"""


def test_derived_ids_are_the_same_after_a_restart() -> None:
    import os
    import subprocess
    import sys

    ids = set()
    for seed in ("1", "2", "3"):  # str hashing (and so set order) differs per process
        done = subprocess.run(
            [sys.executable, "-c", ID_SCRIPT],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.returncode == 0, done.stderr
        ids.add(done.stdout.strip())
    assert len(ids) == 1 and next(iter(ids)).startswith("ship:")


def test_record_wait_is_validated() -> None:
    from tripwire.errors import ConfigError

    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ConfigError) as info:
            Idempotent(lambda: None, record_wait_s=bad)  # type: ignore[arg-type]
        assert info.value.field == "record_wait_s"
