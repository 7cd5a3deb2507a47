"""Which of the guard's pending milestones are on this tree, probed by behaviour.

The adapters' tests assert the full behaviour of issue 14; the parts that stand on a guard
milestone not landed yet are marked ``xfail(strict=True)`` only while the probe says it is
missing, so they turn into plain passing tests the moment it lands.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from tripwire import Guard, Limits, LoopDetected, StopReason
from tripwire.core.receipt import StopReceipt
from tripwire.core.results import ToolResult


def _refuses_the_fourth_call() -> bool:
    guard = Guard()
    try:
        for _ in range(4):
            guard.before_tool("search_docs", {"query": "refund policy"})
            guard.after_tool(
                "search_docs", {"query": "refund policy"}, ToolResult.success("no results")
            )
    except LoopDetected:
        return guard.snapshot().counters.tool_calls == 3
    return False


def _last_step_keeps_the_limit() -> bool:
    guard = Guard(Limits(max_steps=1), prices=None)
    guard.before_step()
    guard.record_usage(model=None, input_tokens=1, output_tokens=1, cost_usd=0.0)
    guard.finish()
    return guard.reason is StopReason.MAX_STEPS


G1 = _refuses_the_fourth_call()
"""The 4th identical call is refused before it runs."""
G2 = "on_loop" in inspect.signature(Guard).parameters
"""``Guard(on_loop="nudge")``."""
G3 = _last_step_keeps_the_limit()
"""After a restricted last step, the run's stop reason is the limit."""
G5 = hasattr(Guard, "after_stop") and (
    "after_stop" in getattr(StopReceipt, "__struct_fields__", ())
    or (
        dataclasses.is_dataclass(StopReceipt)
        and any(f.name == "after_stop" for f in dataclasses.fields(StopReceipt))
    )
)
"""Activity after a stop is carried on the receipt."""

needs_g1 = pytest.mark.xfail(
    not G1, strict=True, reason="the guard's G1 (refuse the 4th identical call) is not landed"
)
needs_g2 = pytest.mark.xfail(
    not G2, strict=True, reason="the guard's G2 (on_loop='nudge') is not landed"
)
needs_g3 = pytest.mark.xfail(
    not G3, strict=True, reason="the guard's G3 (the last step's reason is the limit) is not landed"
)
needs_g5 = pytest.mark.xfail(
    not G5, strict=True, reason="G5 (activity after a stop on the receipt) is not landed"
)


def _orders_pass() -> bool:
    guard = Guard(prices=None)
    try:
        for i in range(30):
            args = {"order_id": f"ORD-{chr(65 + i % 26)}{chr(65 + i // 26)}"}
            guard.before_tool("lookup_order", args)
            guard.after_tool("lookup_order", args, ToolResult.success("shipped"))
    except LoopDetected:
        return False
    return True


ORDERS = _orders_pass()
"""The default policy lets 30 different orders that all come back "shipped" through."""

needs_orders_fix = pytest.mark.xfail(
    not ORDERS,
    strict=True,
    reason="the default policy's same-result rule flags 30 different orders that all come "
    "back 'shipped'; the detection engineer is fixing the rule",
)
