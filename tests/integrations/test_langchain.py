"""LangChain v1 ``create_agent`` (the middleware) and LangGraph ``create_react_agent`` (the
callback handler), on a scripted ``BaseChatModel`` subclass; every tool body and model call is
counted."""

from __future__ import annotations

import asyncio
import logging
import threading
import warnings
from typing import Any

import pytest

pytest.importorskip("langchain")
pytest.importorskip("langgraph")

from langchain.agents import create_agent
from langgraph.prebuilt import ToolNode, create_react_agent

from tripwire import BudgetExceeded, Limits, LoopDetected, RunStopped, StopReason
from tripwire.core.policy import DEFAULT_POLICY
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun
from tripwire.integrations.langchain import TripwireCallbackHandler, TripwireMiddleware

from .agent_scripts import Script, looping, obeys_nudge, scripted, stubborn
from .lc_fakes import ScriptedChatModel, make_tools
from .scripts import Counters, healthy_calls, order_calls
from .xfails import needs_g1, needs_g2, needs_g3, orders_flagged

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::tripwire.prices.CostNotFoundWarning"),
]

MODES = ["create_agent+middleware", "create_react_agent+callbacks", "create_agent+callbacks"]
INPUT = {"messages": [{"role": "user", "content": "What is the refund policy?"}]}
CONFIG: dict[str, Any] = {"recursion_limit": 200}


def run(
    mode: str, script: Script, counters: Counters, name: str = "looper", **options: Any
) -> tuple[Any, list[StopReceipt]]:
    """Build the agent the way a user would, run it, return (what the caller got, receipts)."""
    got: list[StopReceipt] = []
    options.setdefault("on_receipt", got.append)
    model = ScriptedChatModel(script=script, counters=counters)
    tools = make_tools(counters)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent moved in v1
        if mode == "create_agent+middleware":
            agent = create_agent(
                model, tools, middleware=[TripwireMiddleware(agent=name, **options)]
            )
            out = agent.invoke(INPUT, CONFIG)
            return out.get("tripwire") or out["messages"][-1].content, got
        handler = TripwireCallbackHandler(agent=name, **options)
        if mode == "create_react_agent+callbacks":
            graph = create_react_agent(
                model, ToolNode(tools, wrap_tool_call=handler.wrap_tool_call)
            )
        else:
            graph = create_agent(model, tools)
        out = handler.invoke(graph, INPUT, CONFIG)
    return (out if isinstance(out, StoppedRun) else out["messages"][-1].content), got


@pytest.mark.parametrize("mode", MODES)
def test_a_looping_agent_is_stopped_with_a_structured_result(mode: str) -> None:
    counters = Counters()
    out, got = run(mode, looping, counters)
    assert isinstance(out, StoppedRun), out
    assert out.reason is StopReason.LOOP_DETECTED and isinstance(out.error, LoopDetected)
    # No model call after the stop: every call made was counted before it.
    assert counters.model_calls == out.counters.steps
    assert counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED
    assert out.receipt.agent == "looper"


@needs_g1
@pytest.mark.parametrize("mode", MODES)
def test_the_fourth_identical_call_never_runs(mode: str) -> None:
    counters = Counters()
    run(mode, looping, counters)
    assert counters.loop_bodies == 3


def test_the_middleware_ends_the_graph_with_a_final_message() -> None:
    counters = Counters()
    model = ScriptedChatModel(script=looping, counters=counters)
    agent = create_agent(model, make_tools(counters), middleware=[TripwireMiddleware()])
    out = agent.invoke(INPUT, CONFIG)
    last = out["messages"][-1]
    assert last.type == "ai" and last.name == "tripwire" and not last.tool_calls
    assert "loop_detected" in last.content
    assert isinstance(out["tripwire"], StoppedRun)


def test_the_callback_handler_raises_the_stop_with_its_receipt() -> None:
    counters = Counters()
    handler = TripwireCallbackHandler()
    graph = create_agent(ScriptedChatModel(script=looping, counters=counters), make_tools(counters))
    with pytest.raises(RunStopped) as err:
        graph.invoke(INPUT, {**CONFIG, "callbacks": [handler]})
    assert err.value.reason is StopReason.LOOP_DETECTED
    assert isinstance(err.value.receipt, StopReceipt)
    assert counters.model_calls == err.value.counters.steps


@needs_g2
@pytest.mark.parametrize("mode", ["create_agent+middleware", "create_react_agent+callbacks"])
def test_a_model_that_obeys_the_nudge_finishes(mode: str) -> None:
    counters = Counters()
    out, got = run(mode, obeys_nudge, counters, on_loop="nudge")
    assert out == "I could not find the refund policy."
    assert counters.loop_bodies == 3
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
@pytest.mark.parametrize("mode", ["create_agent+middleware", "create_react_agent+callbacks"])
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call(mode: str) -> None:
    counters = Counters()
    out, _ = run(mode, looping, counters, on_loop="nudge")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3
    assert counters.model_calls == out.counters.steps


@pytest.mark.parametrize("mode", MODES)
def test_a_healthy_thirty_call_run_completes_untouched(mode: str) -> None:
    counters = Counters()
    out, got = run(mode, scripted(healthy_calls()), counters, name="researcher")
    assert out == "done"
    assert counters.tool_bodies == 30 and counters.model_calls == 31
    assert got[0].reason is StopReason.COMPLETED and got[0].counters.tool_calls == 30
    assert got[0].counters.input_tokens == 310  # usage read from the model's own messages


@orders_flagged
@pytest.mark.parametrize("mode", MODES)
def test_thirty_different_orders_all_shipped_complete_untouched(mode: str) -> None:
    counters = Counters()
    out, _ = run(mode, scripted(order_calls()), counters)
    assert out == "done" and counters.tool_bodies == 30


@pytest.mark.parametrize("mode", MODES)
def test_a_tool_call_cap_never_refuses_the_final_answer(mode: str) -> None:
    counters = Counters()
    out, _ = run(mode, scripted(healthy_calls()), counters, limits=Limits(max_tool_calls=30))
    assert out == "done" and counters.tool_bodies == 30


def test_a_step_budget_ends_with_the_graceful_last_step() -> None:
    counters = Counters()
    out, got = run(
        "create_agent+middleware", scripted(healthy_calls()), counters, limits=Limits(max_steps=5)
    )
    assert out == "partial: 4 results"  # the 5th model call was made without tools
    assert counters.model_calls == 5 and counters.tool_bodies == 4
    assert len(got) == 1


@needs_g3
def test_the_graceful_last_step_is_recorded_as_the_limit() -> None:
    _, got = run(
        "create_agent+middleware", scripted(healthy_calls()), Counters(), limits=Limits(max_steps=5)
    )
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def _react_with_dynamic_model(
    script: Script, counters: Counters, **options: Any
) -> tuple[TripwireCallbackHandler, Any, list[StopReceipt]]:
    got: list[StopReceipt] = []
    handler = TripwireCallbackHandler(on_receipt=got.append, **options)
    tools = make_tools(counters)
    model = ScriptedChatModel(script=script, counters=counters)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent moved in v1
        graph = create_react_agent(
            handler.dynamic_model(model, tools),
            ToolNode(tools, wrap_tool_call=handler.wrap_tool_call),
        )
    return handler, graph, got


@pytest.mark.parametrize("invoke", ["sync", "async"])
def test_create_react_agent_ends_a_step_budget_with_the_graceful_last_step(invoke: str) -> None:
    # The callbacks alone cannot take the tools away (the 5th call was made with tools and
    # the run ended with no answer); LangGraph's dynamic model does.
    counters = Counters()
    handler, graph, got = _react_with_dynamic_model(
        scripted(healthy_calls()), counters, limits=Limits(max_steps=5)
    )
    if invoke == "sync":
        out = handler.invoke(graph, INPUT, CONFIG)
    else:
        out = asyncio.run(handler.ainvoke(graph, INPUT, CONFIG))
    assert not isinstance(out, StoppedRun)
    assert out["messages"][-1].content == "partial: 4 results"  # the 5th call had no tools
    assert counters.model_calls == 5 and counters.tool_bodies == 4
    assert len(got) == 1 and got[0].reason is StopReason.MAX_STEPS
    assert got[0].counters.steps == 5  # each step counted once, not by both hooks
    assert got[0].condition == {"steps": 5, "max_steps": 5}


def test_create_react_agent_with_the_dynamic_model_runs_healthy_and_stops_loops() -> None:
    counters = Counters()
    handler, graph, got = _react_with_dynamic_model(scripted(healthy_calls()), counters)
    out = handler.invoke(graph, INPUT, CONFIG)
    assert out["messages"][-1].content == "done"
    assert counters.tool_bodies == 30 and got[0].counters.steps == 31
    assert got[0].reason is StopReason.COMPLETED
    counters = Counters()
    handler, graph, got = _react_with_dynamic_model(looping, counters)
    stopped = handler.invoke(graph, INPUT, CONFIG)
    assert isinstance(stopped, StoppedRun) and stopped.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3 and counters.model_calls == stopped.receipt.counters.steps


@pytest.mark.parametrize("mode", MODES)
def test_a_step_budget_ends_with_a_partial_answer_not_an_exception(mode: str) -> None:
    counters = Counters()
    out, got = run(
        mode,
        stubborn(healthy_calls()),
        counters,
        limits=Limits(max_steps=3),
        partial_answer=lambda snap: f"{snap.counters.tool_calls} calls made",
    )
    assert isinstance(out, StoppedRun) and isinstance(out.error, BudgetExceeded)
    assert out.reason is StopReason.MAX_STEPS and out.partial is not None
    assert counters.model_calls == 3
    assert got[0].reason is StopReason.MAX_STEPS


@pytest.mark.parametrize("mode", MODES)
def test_two_runs_in_threads_are_judged_separately(mode: str) -> None:
    results: dict[str, Any] = {}
    counters = {"loop": Counters(), "healthy": Counters()}
    scripts = {"loop": looping, "healthy": scripted(healthy_calls())}
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = run(mode, scripts[name], counters[name], name=name)

    threads = [threading.Thread(target=work, args=(n,)) for n in scripts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loop_out, _ = results["loop"]
    assert isinstance(loop_out, StoppedRun) and loop_out.receipt.agent == "loop"
    assert results["healthy"][0] == "done" and counters["healthy"].tool_bodies == 30


def _two_calls_then_done(i: int, seen: list[str], tools: bool) -> Any:
    return [("search_docs", {"query": "refund policy"})] if len(seen) < 2 else "done"


async def test_one_middleware_judges_concurrent_tasks_separately() -> None:
    middleware = TripwireMiddleware()
    agents = []
    for _ in range(4):
        counters = Counters()
        model = ScriptedChatModel(script=_two_calls_then_done, counters=counters)
        agents.append(create_agent(model, make_tools(counters), middleware=[middleware]))
    outs = await asyncio.gather(*(a.ainvoke(INPUT, CONFIG) for a in agents))
    # Two identical calls per run: one shared guard would have seen 8 and stopped.
    assert [o["messages"][-1].content for o in outs] == ["done"] * 4


async def test_one_handler_judges_concurrent_tasks_separately() -> None:
    handler = TripwireCallbackHandler()
    graphs = []
    for _ in range(4):
        counters = Counters()
        model = ScriptedChatModel(script=_two_calls_then_done, counters=counters)
        graphs.append(create_agent(model, make_tools(counters)))
    outs = await asyncio.gather(*(handler.ainvoke(g, INPUT, CONFIG) for g in graphs))
    assert [o["messages"][-1].content for o in outs] == ["done"] * 4


def test_a_refusal_a_callback_cannot_deliver_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counters = Counters()
    handler = TripwireCallbackHandler(Limits(max_steps=3))
    graph = create_agent(
        ScriptedChatModel(script=stubborn(healthy_calls()), counters=counters),
        make_tools(counters),
    )
    with caplog.at_level("WARNING", logger="tripwire.integrations"):
        out = handler.invoke(graph, INPUT, CONFIG)
    assert isinstance(out, StoppedRun) and out.reason is StopReason.MAX_STEPS
    assert caplog.text.count("cannot replace a tool's result") == 1
    assert counters.tool_bodies == 3  # the refused 3rd call ran: no interceptor on this graph
    # ...and the receipt counts it: it says what ran, not what tripwire would have let run.
    assert out.receipt.counters.tool_calls == counters.tool_bodies


CALLBACK_MODES = ["create_react_agent+callbacks", "create_agent+callbacks"]


@pytest.mark.parametrize("mode", CALLBACK_MODES)
@pytest.mark.parametrize(
    ("script", "limits", "reason"),
    [
        (looping, Limits(), StopReason.LOOP_DETECTED),
        (stubborn(healthy_calls()), Limits(max_steps=3), StopReason.MAX_STEPS),
        (looping, Limits(max_total_tokens=30), StopReason.MAX_TOTAL_TOKENS),
    ],
    ids=["loop", "steps", "tokens"],
)
def test_a_clean_stop_prints_no_callback_error(
    mode: str, script: Script, limits: Limits, reason: StopReason,
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    # LangChain logged "Error in TripwireCallbackHandler.<event> callback: LoopDetected(...)"
    # for every stop the handler raised on purpose.
    counters = Counters()
    with caplog.at_level(logging.DEBUG):
        out, got = run(mode, script, counters, limits=limits, loop_policy=None
                       if reason is not StopReason.LOOP_DETECTED else DEFAULT_POLICY)  # fmt: skip
    assert isinstance(out, StoppedRun) and out.reason is reason
    assert counters.model_calls <= 4 and got == [out.receipt]
    assert "Error in" not in caplog.text
    assert "Error in" not in capfd.readouterr().err


def test_a_clean_stop_of_an_async_run_prints_no_callback_error(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    counters = Counters()
    handler = TripwireCallbackHandler()
    graph = create_agent(ScriptedChatModel(script=looping, counters=counters), make_tools(counters))
    with caplog.at_level(logging.DEBUG):
        out = asyncio.run(handler.ainvoke(graph, INPUT, CONFIG))
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3
    assert "Error in" not in caplog.text and "Error in" not in capfd.readouterr().err


def test_a_real_error_in_a_callback_is_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(TripwireCallbackHandler):
        def on_llm_end(self, response: Any, **kwargs: Any) -> None:
            super().on_llm_end(response, **kwargs)
            raise ValueError("a bug in a callback")

    counters = Counters()
    graph = create_agent(ScriptedChatModel(script=looping, counters=counters), make_tools(counters))
    with caplog.at_level(logging.WARNING), pytest.raises(ValueError, match="a bug"):
        Broken().invoke(graph, INPUT, CONFIG)
    assert "Error in Broken.on_llm_end callback: ValueError('a bug in a callback')" in caplog.text


def _batch(i: int, seen: list[str], tools: bool) -> Any:
    return [("search_docs", {"query": "refund policy"})] * 2


@needs_g1
@pytest.mark.parametrize("mode", MODES)
def test_a_stop_inside_a_parallel_batch_ends_the_run(mode: str) -> None:
    counters = Counters()
    out, got = run(mode, _batch, counters)
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3 and counters.model_calls == 2
    after = got[0].after_stop
    assert after is None or not after.active  # nothing ran after the stop


@pytest.mark.parametrize("mode", ["create_agent+middleware"])
def test_a_token_budget_ends_with_the_tool_less_answer_kept(mode: str) -> None:
    from ._guard_milestones import G3

    counters = Counters()
    out, got = run(mode, scripted(healthy_calls()), counters, limits=Limits(max_total_tokens=40))
    # 13 tokens a call: the 3rd call reaches 39 of 40, so its tool call is refused and the
    # 4th call goes out without tools.
    assert counters.model_calls == 4 and counters.tool_bodies == 2
    if G3:  # its answer is kept, though its own usage crosses the limit
        assert out == "partial: 3 results"
    else:
        assert isinstance(out, StoppedRun) and out.partial == "partial: 3 results"
    assert got[0].reason is StopReason.MAX_TOTAL_TOKENS


def _two_calls_then_crash(i: int, seen: list[str], tools: bool) -> Any:
    if i < 2:
        return [("search_docs", {"query": f"topic {i}"})]
    raise RuntimeError("model down")


@pytest.mark.parametrize("mode", ["create_react_agent+callbacks", "create_agent+callbacks"])
def test_a_graph_that_crashes_hands_over_a_receipt_that_claims_no_end(mode: str) -> None:
    counters = Counters()
    got: list[StopReceipt] = []
    with pytest.raises(RuntimeError, match="model down"):
        run(mode, _two_calls_then_crash, counters, on_receipt=got.append)
    assert len(got) == 1
    assert got[0].reason is None and got[0].end is None  # was "completed" before
    assert got[0].counters.tool_calls == 2 and counters.tool_bodies == 2
