"""tripwire in Google ADK, as a Runner plugin, on ADK's own ``MockModel`` (offline).

Every test counts what really happened: the tool bodies that ran and the requests ``MockModel``
received, not what tripwire says it did.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("google.adk")

from google.adk.agents import Agent
from google.adk.cli.agent_test_runner import MockModel
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.adk.tools import FunctionTool
from google.genai import types

from tripwire import BudgetExceeded, ConfigError, Limits, LoopDetected, StopReason
from tripwire.core.budget import NO_LIMITS
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun
from tripwire.integrations.google_adk import STOPPED_ERROR_CODE, TripwirePlugin, run

from ._guard_milestones import needs_g1, needs_g2, needs_g3, needs_g5, needs_orders_fix
from .scripts import (
    LOOP_ARGS,
    LOOP_TOOL,
    NUDGE_TEXT_START,
    Counters,
    healthy_calls,
    order_calls,
    run_body,
)

pytestmark = pytest.mark.frameworks

INPUT_TOKENS, OUTPUT_TOKENS = 10, 3
Reply = tuple[str, dict[str, Any]] | str
"""One scripted model response: a tool call or an answer."""


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No connection may leave the process while ADK runs (``MockModel`` needs none)."""

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"a connection to {address!r} was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def _batch(i: int, calls: list[tuple[str, dict[str, Any]]]) -> LlmResponse:
    """One response asking for several tool calls at once (ADK runs them concurrently)."""
    parts = [
        types.Part(function_call=types.FunctionCall(name=n, args=a, id=f"call_{i}_{k}"))
        for k, (n, a) in enumerate(calls)
    ]
    return LlmResponse(content=types.Content(role="model", parts=parts))


def _response(i: int, reply: Reply) -> LlmResponse:
    usage = types.GenerateContentResponseUsageMetadata(
        prompt_token_count=INPUT_TOKENS, candidates_token_count=OUTPUT_TOKENS,
        total_token_count=INPUT_TOKENS + OUTPUT_TOKENS,
    )  # fmt: skip
    if isinstance(reply, str):
        part = types.Part.from_text(text=reply)
    else:
        name, args = reply
        part = types.Part(function_call=types.FunctionCall(name=name, args=args, id=f"call_{i}"))
    return LlmResponse(content=types.Content(role="model", parts=[part]), usage_metadata=usage)


def _seen(request: Any) -> str:
    """Everything the model was shown in one request (function responses included)."""
    texts: list[str] = []
    for content in request.contents:
        for part in content.parts or ():
            if part.text:
                texts.append(part.text)
            if part.function_response is not None:
                texts.append(str(part.function_response.response))
    return "\n".join(texts)


LOOPING: list[Reply] = [(LOOP_TOOL, dict(LOOP_ARGS))] * 40


class Harness:
    """An ADK agent on ``MockModel`` whose tool bodies and model requests are counted."""

    def __init__(self, replies: list[Reply], name: str = "looper") -> None:
        self.counters = Counters()
        self.at_stop: int | None = None
        self.model = MockModel(
            responses=[_response(i, r) for i, r in enumerate(replies)], requests=[]
        )
        counters = self.counters

        def search_docs(query: str) -> str:
            """Search the documentation."""
            return run_body(counters, "search_docs", {"query": query})

        def fetch_page(url: str) -> str:
            """Fetch one page."""
            return run_body(counters, "fetch_page", {"url": url})

        def lookup_order(order_id: str) -> str:
            """Look up one order."""
            return run_body(counters, "lookup_order", {"order_id": order_id})

        self.agent = Agent(
            name=name, model=self.model, instruction="Answer from the documentation.",
            tools=[FunctionTool(search_docs), FunctionTool(fetch_page), FunctionTool(lookup_order)],
        )  # fmt: skip

    @property
    def requests(self) -> list[Any]:
        return list(self.model.requests)

    def partial(self, snapshot: Any) -> str:
        """A partial-answer hook: also notes how many model requests were made at the stop."""
        self.at_stop = len(self.model.requests)
        return f"partial after {snapshot.counters.tool_calls} tool calls"

    def plugin(self, limits: Limits = NO_LIMITS, **options: Any) -> TripwirePlugin:
        return TripwirePlugin(limits, partial_answer=self.partial, **options)

    async def run(self, plugin: TripwirePlugin) -> list[Any] | StoppedRun:
        sessions = InMemorySessionService()
        runner = Runner(app_name="tripwire_test", agent=self.agent, session_service=sessions,
                        plugins=[plugin])  # fmt: skip
        session = await sessions.create_session(app_name="tripwire_test", user_id="user")
        message = types.Content(role="user", parts=[types.Part.from_text(text="Refund policy?")])
        return await run(runner, user_id="user", session_id=session.id, new_message=message)

    def run_sync(self, plugin: TripwirePlugin) -> list[Any] | StoppedRun:
        return asyncio.run(self.run(plugin))


def _answer(events: list[Any] | StoppedRun) -> str | None:
    assert isinstance(events, list)
    texts = [p.text for e in events if e.content for p in e.content.parts or () if p.text]
    return texts[-1] if texts else None


def _receipts() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


def _script(calls: list[tuple[str, dict[str, Any]]], answer: str = "done") -> list[Reply]:
    return [*calls, answer]


# -- kill switch -------------------------------------------------------------------------------


def test_a_looping_agent_is_stopped_with_a_structured_result() -> None:
    h = Harness(LOOPING)
    got, sink = _receipts()
    out = h.run_sync(h.plugin(on_receipt=sink))
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED
    assert isinstance(out.error, LoopDetected) and out.error.tool == LOOP_TOOL
    # No model request after the stop: the tool response ended the invocation.
    assert h.at_stop is not None and len(h.requests) == h.at_stop
    assert h.counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED
    assert out.receipt.agent == "looper"


@needs_g1
def test_the_fourth_identical_call_is_refused_before_its_body_runs() -> None:
    h = Harness(LOOPING)
    out = h.run_sync(h.plugin())
    assert isinstance(out, StoppedRun)
    assert h.counters.loop_bodies == 3 and len(h.requests) == 4


def test_a_plain_run_async_ends_with_the_stop_as_adks_final_event() -> None:
    h = Harness(LOOPING)
    plugin = h.plugin()

    async def main() -> list[Any]:
        sessions = InMemorySessionService()
        runner = Runner(app_name="t", agent=h.agent, session_service=sessions, plugins=[plugin])
        session = await sessions.create_session(app_name="t", user_id="u")
        message = types.Content(role="user", parts=[types.Part.from_text(text="q")])
        return [e async for e in runner.run_async(user_id="u", session_id=session.id,
                                                    new_message=message)]  # fmt: skip

    events = asyncio.run(main())
    last = events[-1]
    assert last.is_final_response()
    (response,) = last.get_function_responses()
    assert response.response["error_code"] == STOPPED_ERROR_CODE
    stopped = plugin.stopped_run(last.invocation_id)
    assert stopped is not None and stopped.reason is StopReason.LOOP_DETECTED


@needs_g1
@needs_g5
def test_a_stopping_parallel_batch_runs_three_bodies_and_nothing_after_the_stop() -> None:
    h = Harness([])
    h.model.responses = [_batch(i, [(LOOP_TOOL, dict(LOOP_ARGS))] * 3) for i in range(10)]
    out = h.run_sync(h.plugin())
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert len(h.requests) == 2 == h.at_stop
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


# -- nudge -------------------------------------------------------------------------------------


@needs_g2
def test_a_model_that_obeys_the_nudge_finishes_untouched() -> None:
    # The 4th identical call is nudged instead of run; the model answers on seeing the nudge.
    h = Harness([(LOOP_TOOL, dict(LOOP_ARGS))] * 4 + ["I could not find the refund policy."])
    got, sink = _receipts()
    out = h.run_sync(h.plugin(on_loop="nudge", on_receipt=sink))
    assert _answer(out) == "I could not find the refund policy."
    assert h.counters.loop_bodies == 3 and len(h.requests) == 5
    assert NUDGE_TEXT_START in _seen(h.requests[-1])
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call() -> None:
    h = Harness(LOOPING)
    out = h.run_sync(h.plugin(on_loop="nudge"))
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert len(h.requests) == 5 == h.at_stop
    assert NUDGE_TEXT_START in _seen(h.requests[-1])
    assert out.receipt.reason is StopReason.LOOP_DETECTED


# -- healthy runs ------------------------------------------------------------------------------


def test_a_healthy_thirty_call_run_completes_untouched() -> None:
    h = Harness(_script(healthy_calls()), name="researcher")
    got, sink = _receipts()
    out = h.run_sync(h.plugin(Limits(max_tool_calls=30), on_receipt=sink))
    assert _answer(out) == "done"
    assert h.counters.tool_bodies == 30 and len(h.requests) == 31
    assert got[0].reason is StopReason.COMPLETED
    assert got[0].counters.tool_calls == 30 and got[0].counters.steps == 31
    # Usage came from ADK's own usage_metadata, counted once per model call.
    assert got[0].counters.input_tokens == 31 * INPUT_TOKENS


@needs_orders_fix
def test_thirty_different_orders_all_shipped_complete_untouched() -> None:
    h = Harness(_script(order_calls()), name="orders")
    out = h.run_sync(h.plugin())
    assert _answer(out) == "done"
    assert h.counters.tool_bodies == 30


# -- budgets -----------------------------------------------------------------------------------


def test_a_step_budget_ends_with_the_graceful_last_steps_answer() -> None:
    h = Harness(_script(healthy_calls()[:4], "partial: 4 results"))
    got, sink = _receipts()
    out = h.run_sync(h.plugin(Limits(max_steps=5), on_receipt=sink))
    assert _answer(out) == "partial: 4 results"
    assert h.counters.tool_bodies == 4 and len(h.requests) == 5
    last = h.requests[-1]
    assert not last.config.tools and not last.tools_dict  # the last call without tools
    assert "answer now" in str(last.config.system_instruction)
    assert all(r.config.tools for r in h.requests[:-1])
    assert len(got) == 1


@needs_g3
def test_the_graceful_last_step_records_the_limit_as_the_reason() -> None:
    h = Harness(_script(healthy_calls()[:4], "partial: 4 results"))
    got, sink = _receipts()
    h.run_sync(h.plugin(Limits(max_steps=5), on_receipt=sink))
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def test_a_model_that_ignores_the_wrap_up_is_stopped_with_a_partial_answer() -> None:
    h = Harness(list(healthy_calls()))
    out = h.run_sync(h.plugin(Limits(max_steps=3)))
    assert isinstance(out, StoppedRun)
    assert isinstance(out.error, BudgetExceeded) and out.reason is StopReason.MAX_STEPS
    assert len(h.requests) == 3 == h.at_stop  # the 4th model request was never made
    assert h.counters.tool_bodies == 2  # the 3rd step's tool call was refused
    assert out.partial == "partial after 2 tool calls"
    assert out.receipt.reason is StopReason.MAX_STEPS


def test_a_token_budget_is_enforced_from_adks_usage() -> None:
    h = Harness(LOOPING)
    plugin = TripwirePlugin(Limits(max_total_tokens=3 * (INPUT_TOKENS + OUTPUT_TOKENS)),
                            loop_policy=None, partial_answer=h.partial)  # fmt: skip
    out = h.run_sync(plugin)
    assert isinstance(out, StoppedRun) and out.reason is StopReason.MAX_TOTAL_TOKENS
    assert len(h.requests) == 3


# -- receipts ----------------------------------------------------------------------------------


@needs_g5
def test_a_receipt_never_claims_a_stop_the_run_went_past() -> None:
    h = Harness(LOOPING)
    out = h.run_sync(h.plugin())
    assert isinstance(out, StoppedRun)
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


def test_the_plugin_forgets_finished_invocations() -> None:
    h = Harness(_script(healthy_calls()[:2]))
    plugin = h.plugin()
    assert _answer(h.run_sync(plugin)) == "done"
    assert plugin._runs == {} and plugin._refused == set()


def test_an_invocation_that_crashes_still_hands_over_a_receipt_that_claims_no_end() -> None:
    h = Harness([(LOOP_TOOL, {"query": "billing"})])  # MockModel runs out of responses
    got, sink = _receipts()
    with pytest.raises(IndexError):
        h.run_sync(h.plugin(on_receipt=sink))
    assert len(got) == 1 and got[0].reason is None and got[0].end is None


# -- two runs at once --------------------------------------------------------------------------


async def test_two_invocations_in_two_tasks_are_judged_separately() -> None:
    plugin = TripwirePlugin()
    loop_h, healthy_h = Harness(LOOPING), Harness(_script(healthy_calls()))
    loop_out, healthy_out = await asyncio.gather(loop_h.run(plugin), healthy_h.run(plugin))
    assert isinstance(loop_out, StoppedRun) and loop_out.reason is StopReason.LOOP_DETECTED
    assert _answer(healthy_out) == "done" and healthy_h.counters.tool_bodies == 30


def test_two_invocations_in_two_threads_are_judged_separately() -> None:
    plugin = TripwirePlugin()
    harnesses = {"loop": Harness(LOOPING), "healthy": Harness(_script(healthy_calls()))}
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = harnesses[name].run_sync(plugin)

    threads = [threading.Thread(target=work, args=(n,)) for n in harnesses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun)
    assert _answer(results["healthy"]) == "done"


def test_the_agent_option_names_the_agent_on_receipts() -> None:
    h = Harness(LOOPING)
    got, sink = _receipts()
    h.run_sync(h.plugin(agent="support", on_receipt=sink))
    assert got[0].agent == "support"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        TripwirePlugin(agent="")
    assert err.value.field == "agent"
    with pytest.raises(ConfigError) as err:
        TripwirePlugin(on_loop="page")
    assert err.value.field == "on_loop"
    with pytest.raises(ConfigError) as err:
        asyncio.run(run(object(), user_id="u", session_id="s", new_message=types.Content()))
    assert err.value.field == "runner"


def test_the_example_runs() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "google_adk_loop.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "stopped: loop_detected" in out.stdout
    assert "receipt: loop_detected" in out.stdout
