"""pydantic-ai: the Tripwire capability on a real Agent, driven by FunctionModel.

Every test counts what really ran: tool bodies (in the tools) and model calls (in the model
function), and compares them with the stop.
"""

from __future__ import annotations

import asyncio
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage, UsageLimits

from tripwire import BudgetExceeded, Limits, LoopDetected, RunStopped, StopReason
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun, current_run
from tripwire.integrations.pydantic_ai import Tripwire, limits_from_usage

from .scripts import (
    LOOP_ARGS,
    LOOP_TOOL,
    NUDGE_TEXT_START,
    Counters,
    healthy_calls,
    order_calls,
    run_body,
)
from .xfails import needs_g1, needs_g2, needs_g3, orders_flagged

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::tripwire.prices.CostNotFoundWarning"),
]

Script = Callable[[int, list[str], bool], "list[tuple[str, dict[str, Any]]] | str"]
"""(model call index, tool results so far, tools offered) -> tool calls or an answer."""


def looping(i: int, seen: list[str], tools: bool) -> list[tuple[str, dict[str, Any]]] | str:
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def obeys_nudge(i: int, seen: list[str], tools: bool) -> list[tuple[str, dict[str, Any]]] | str:
    if any(s.startswith(NUDGE_TEXT_START) for s in seen):
        return "I could not find the refund policy."
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    def script(i: int, seen: list[str], tools: bool) -> list[tuple[str, dict[str, Any]]] | str:
        if not tools:
            return f"partial: {len(seen)} results"
        return [calls[i]] if i < len(calls) else "done"

    return script


def stubborn(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    """Calls tools even when none are offered (ignores the wrap-up)."""
    return lambda i, seen, tools: [calls[i]]


def build(
    script: Script, counters: Counters, capability: Tripwire, name: str = "looper"
) -> Agent[None, Any]:
    def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        i = counters.model() - 1
        seen = [
            str(p.content)
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, ToolReturnPart)
        ]
        reply = script(i, seen, bool(info.function_tools))
        usage = RequestUsage(input_tokens=10, output_tokens=3)
        if isinstance(reply, str):
            return ModelResponse(parts=[TextPart(reply)], usage=usage)
        parts = [
            ToolCallPart(tool, args, tool_call_id=f"call_{i}_{j}")
            for j, (tool, args) in enumerate(reply)
        ]
        return ModelResponse(parts=parts, usage=usage)

    agent: Agent[None, Any] = Agent(FunctionModel(model_fn), name=name, capabilities=[capability])

    @agent.tool_plain
    def search_docs(query: str) -> str:
        """Search the documentation."""
        return run_body(counters, "search_docs", {"query": query})

    @agent.tool_plain
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return run_body(counters, "fetch_page", {"url": url})

    @agent.tool_plain
    def lookup_order(order_id: str) -> str:
        """Look up one order."""
        return run_body(counters, "lookup_order", {"order_id": order_id})

    return agent


def sink() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


def test_a_looping_agent_is_stopped_with_a_structured_result() -> None:
    got, on_receipt = sink()
    counters = Counters()
    agent = build(looping, counters, Tripwire(on_receipt=on_receipt))
    out = agent.run_sync("What is the refund policy?").output
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED and isinstance(out.error, LoopDetected)
    # No model call after the stop: every call made was counted before it.
    assert counters.model_calls == out.counters.steps
    assert counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED
    assert out.receipt.agent == "looper"


@needs_g1
def test_the_fourth_identical_call_never_runs() -> None:
    counters = Counters()
    build(looping, counters, Tripwire()).run_sync("What is the refund policy?")
    assert counters.loop_bodies == 3


def test_raise_on_stop_raises_the_stop_with_its_receipt() -> None:
    counters = Counters()
    agent = build(looping, counters, Tripwire(raise_on_stop=True))
    with pytest.raises(RunStopped) as err:
        agent.run_sync("What is the refund policy?")
    assert err.value.reason is StopReason.LOOP_DETECTED
    assert isinstance(err.value.receipt, StopReceipt)
    assert counters.model_calls == err.value.counters.steps


@needs_g2
def test_a_model_that_obeys_the_nudge_finishes() -> None:
    got, on_receipt = sink()
    counters = Counters()
    agent = build(obeys_nudge, counters, Tripwire(on_loop="nudge", on_receipt=on_receipt))
    out = agent.run_sync("What is the refund policy?").output
    assert out == "I could not find the refund policy."
    assert counters.loop_bodies == 3
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call() -> None:
    counters = Counters()
    out = build(looping, counters, Tripwire(on_loop="nudge")).run_sync("q").output
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3
    assert counters.model_calls == out.counters.steps


def test_a_healthy_thirty_call_run_completes_untouched() -> None:
    got, on_receipt = sink()
    counters = Counters()
    agent = build(scripted(healthy_calls()), counters, Tripwire(on_receipt=on_receipt))
    result = agent.run_sync("Research the docs", usage_limits=UsageLimits(request_limit=None))
    assert result.output == "done"
    assert counters.tool_bodies == 30 and counters.model_calls == 31
    assert got[0].reason is StopReason.COMPLETED and got[0].counters.tool_calls == 30
    assert got[0].counters.input_tokens == 310  # usage read from the responses themselves


@orders_flagged
def test_thirty_different_orders_all_shipped_complete_untouched() -> None:
    counters = Counters()
    agent = build(scripted(order_calls()), counters, Tripwire())
    out = agent.run_sync("Check the orders", usage_limits=UsageLimits(request_limit=None))
    assert out.output == "done" and counters.tool_bodies == 30


def test_a_tool_call_cap_never_refuses_the_final_answer() -> None:
    counters = Counters()
    agent = build(scripted(healthy_calls()), counters, Tripwire(Limits(max_tool_calls=30)))
    out = agent.run_sync("Research", usage_limits=UsageLimits(request_limit=None))
    assert out.output == "done" and counters.tool_bodies == 30


def test_a_step_budget_ends_with_the_graceful_last_step() -> None:
    got, on_receipt = sink()
    counters = Counters()
    agent = build(
        scripted(healthy_calls()), counters, Tripwire(Limits(max_steps=5), on_receipt=on_receipt)
    )
    out = agent.run_sync("Research").output
    assert out == "partial: 4 results"  # the 5th request went out without tools
    assert counters.model_calls == 5 and counters.tool_bodies == 4
    assert len(got) == 1


@needs_g3
def test_the_graceful_last_step_is_recorded_as_the_limit() -> None:
    got, on_receipt = sink()
    agent = build(
        scripted(healthy_calls()), Counters(), Tripwire(Limits(max_steps=5), on_receipt=on_receipt)
    )
    agent.run_sync("Research")
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def test_a_model_that_ignores_the_wrap_up_gets_the_partial_answer() -> None:
    counters = Counters()
    capability = Tripwire(
        Limits(max_steps=3), partial_answer=lambda snap: f"{snap.counters.tool_calls} calls made"
    )
    out = build(stubborn(healthy_calls()), counters, capability).run_sync("Research").output
    assert isinstance(out, StoppedRun) and isinstance(out.error, BudgetExceeded)
    assert out.reason is StopReason.MAX_STEPS and out.partial == "2 calls made"
    assert counters.model_calls == 3 and counters.tool_bodies == 2
    assert out.receipt.reason is StopReason.MAX_STEPS


def test_usage_limits_are_bridged_to_a_graceful_last_step() -> None:
    counters = Counters()
    agent = build(scripted(healthy_calls()), counters, Tripwire())
    out = agent.run_sync("Research", usage_limits=UsageLimits(request_limit=3)).output
    assert out == "partial: 2 results"  # not UsageLimitExceeded
    assert counters.model_calls == 3


def test_limits_from_usage_keeps_what_tripwire_was_given() -> None:
    limits = limits_from_usage(
        Limits(max_steps=7), UsageLimits(request_limit=50, total_tokens_limit=900)
    )
    assert limits.max_steps == 7 and limits.max_total_tokens == 900
    assert limits_from_usage(Limits(), None) == Limits()


def test_two_runs_in_threads_are_judged_separately() -> None:
    results: dict[str, Any] = {}
    counters = {"loop": Counters(), "healthy": Counters()}
    capability = Tripwire()  # one capability, shared by both agents' runs
    agents = {
        "loop": build(looping, counters["loop"], capability, "loop"),
        "healthy": build(scripted(healthy_calls()), counters["healthy"], capability, "healthy"),
    }
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = (
            agents[name].run_sync("q", usage_limits=UsageLimits(request_limit=None)).output
        )

    threads = [threading.Thread(target=work, args=(n,)) for n in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun) and results["loop"].receipt.agent == "loop"
    assert results["healthy"] == "done" and counters["healthy"].tool_bodies == 30


async def test_two_runs_in_asyncio_tasks_are_judged_separately() -> None:
    counters = Counters()
    seen_runs: set[int] = set()

    def script(i: int, seen: list[str], tools: bool) -> list[tuple[str, dict[str, Any]]] | str:
        run = current_run.get()
        assert run is not None
        seen_runs.add(id(run))
        return [(LOOP_TOOL, dict(LOOP_ARGS))] if len(seen) < 2 else "done"

    agent = build(script, counters, Tripwire())
    outs = await asyncio.gather(*(agent.run("q") for _ in range(4)))
    # Two identical calls per run: a shared guard would have seen 8 and stopped.
    assert [o.output for o in outs] == ["done"] * 4
    assert len(seen_runs) == 4


def test_no_cost_warning_leaks_when_prices_are_off() -> None:
    counters = Counters()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = build(scripted(healthy_calls(2)), counters, Tripwire(prices=None)).run_sync("q")
    assert out.output == "done"


def _batch(i: int, seen: list[str], tools: bool) -> list[tuple[str, dict[str, Any]]] | str:
    return [(LOOP_TOOL, dict(LOOP_ARGS)), (LOOP_TOOL, dict(LOOP_ARGS))]


@needs_g1
def test_identical_calls_of_one_parallel_batch_are_judged_in_turn() -> None:
    counters = Counters()
    out = build(_batch, counters, Tripwire()).run_sync("q").output
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3  # the 4th, beside the 3rd in the second batch, never ran
    assert counters.model_calls == 2


@needs_g1
def test_calls_of_one_batch_that_differ_only_in_a_volatile_key_take_turns_too() -> None:
    # The watcher counts these six as one call (request_id is volatile); they took turns by
    # their raw arguments, so all six ran side by side and five bodies of a loop ran.
    bodies: list[str] = []
    got, on_receipt = sink()
    model_calls = 0

    def model_fn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        nonlocal model_calls
        model_calls += 1
        if model_calls > 10:
            return ModelResponse(parts=[TextPart("gave up")])
        return ModelResponse(
            parts=[
                ToolCallPart(
                    LOOP_TOOL,
                    {**LOOP_ARGS, "request_id": f"req-{model_calls}-{j}"},
                    tool_call_id=f"call_{model_calls}_{j}",
                )
                for j in range(6)
            ]
        )

    agent: Agent[None, Any] = Agent(
        FunctionModel(model_fn), capabilities=[Tripwire(prices=None, on_receipt=on_receipt)]
    )

    @agent.tool_plain
    def search_docs(query: str, request_id: str = "") -> str:
        """Search the documentation."""
        bodies.append(request_id)
        return "No results."

    out = agent.run_sync("q").output
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert len(bodies) == 3  # the 4th of the batch waited its turn and was refused
    assert model_calls == 1
    assert got[0].counters.tool_calls == len(bodies)


def test_a_token_budget_ends_with_the_tool_less_answer_kept() -> None:
    from ._guard_milestones import G3

    got, on_receipt = sink()
    counters = Counters()
    capability = Tripwire(Limits(max_total_tokens=40), on_receipt=on_receipt)
    out = build(scripted(healthy_calls()), counters, capability).run_sync("Research").output
    assert counters.model_calls == 4 and counters.tool_bodies == 2
    if G3:
        assert out == "partial: 3 results"
    else:
        assert isinstance(out, StoppedRun) and out.partial == "partial: 3 results"
    assert got[0].reason is StopReason.MAX_TOTAL_TOKENS


def _two_calls_then_crash(i: int, seen: list[str], tools: bool) -> Any:
    if i < 2:
        return [("search_docs", {"query": f"topic {i}"})]
    raise RuntimeError("model down")


def test_a_run_that_crashes_still_hands_over_a_receipt_that_claims_no_end() -> None:
    got, on_receipt = sink()
    counters = Counters()
    agent = build(_two_calls_then_crash, counters, Tripwire(on_receipt=on_receipt))
    with pytest.raises(RuntimeError, match="model down"):
        agent.run_sync("What is the refund policy?")
    assert len(got) == 1
    receipt = got[0]
    assert receipt.reason is None and receipt.end is None  # never "completed"
    assert receipt.counters.tool_calls == 2 and counters.tool_bodies == 2


async def test_a_cancelled_run_is_recorded_as_a_user_abort() -> None:
    # A cancelled task, not a KeyboardInterrupt through run_sync: that one leaves pydantic-ai's
    # event loop with a thread-pool worker (not a daemon) that keeps the test process alive.
    got, on_receipt = sink()
    counters = Counters()
    started = asyncio.Event()

    def calls_slow(i: int, seen: list[str], tools: bool) -> Any:
        return [("slow_lookup", {"key": "k"})]

    agent = build(calls_slow, counters, Tripwire(on_receipt=on_receipt))

    @agent.tool_plain
    async def slow_lookup(key: str) -> str:
        """A lookup that does not answer in time."""
        started.set()
        await asyncio.sleep(60)
        return key

    task = asyncio.create_task(agent.run("What is the refund policy?"))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.reason for r in got] == [StopReason.USER_CANCELLED]
