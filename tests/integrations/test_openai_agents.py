"""tripwire in the OpenAI Agents SDK, on the SDK's own ``agents.testing.ScriptedModel``.

Every test counts what really happened: the tool bodies that ran and the model calls the SDK
made (the scripted model records each call), not what tripwire says it did.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("agents")
pytest.importorskip("agents.testing")

from agents import Agent, FunctionTool, RunHooks, function_tool, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded
from agents.result import RunResult
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call
from agents.usage import Usage

from tripwire import BudgetExceeded, ConfigError, Limits, LoopDetected, StopReason
from tripwire.core.budget import NO_LIMITS
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun
from tripwire.integrations.openai_agents import Tripwire, TripwireHooks, stopped_run_from

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



@pytest.fixture(autouse=True, scope="module")
def _no_upload() -> Iterator[None]:
    """No upload to the OpenAI backend while these tests run; the SDK's switch is process-wide,
    so it is turned back on afterwards (the span tests in tests/frameworks need its traces)."""
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)

Reply = list[tuple[str, dict[str, Any]]] | str
Script = Callable[[int, list[str], bool], Reply]
"""(model call index, tool outputs seen so far, tools offered) -> tool calls or an answer."""

INPUT_TOKENS, OUTPUT_TOKENS = 10, 3


def looping(i: int, seen: list[str], tools: bool) -> Reply:
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def obeys_nudge(i: int, seen: list[str], tools: bool) -> Reply:
    if any(s.startswith(NUDGE_TEXT_START) for s in seen):
        return "I could not find the refund policy."
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    def script(i: int, seen: list[str], tools: bool) -> Reply:
        if not tools:
            return f"partial: {len(seen)} results"
        return [calls[i]] if i < len(calls) else "done"

    return script


def _outputs(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    return [
        str(item.get("output"))
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]


class Harness:
    """An agent on ``ScriptedModel`` whose tool bodies and model calls are counted."""

    def __init__(self, script: Script, name: str = "looper") -> None:
        self.counters = Counters()
        self.model_calls: list[Any] = []
        self.at_stop: int | None = None

        def responder(call: Any) -> ModelStep:
            self.model_calls.append(call)
            i = self.counters.model() - 1
            tools = call.model_settings.tool_choice != "none"
            reply = script(i, _outputs(call.input), tools)
            usage = Usage(requests=1, input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS,
                          total_tokens=INPUT_TOKENS + OUTPUT_TOKENS)  # fmt: skip
            if isinstance(reply, str):
                return ModelStep(output=[assistant_message(reply)], usage=usage)
            output = [
                function_call(n, a, call_id=f"call_{i}_{k}") for k, (n, a) in enumerate(reply)
            ]
            return ModelStep(output=output, usage=usage)

        counters = self.counters

        @function_tool
        def search_docs(query: str) -> str:
            """Search the documentation."""
            return run_body(counters, "search_docs", {"query": query})

        @function_tool
        def fetch_page(url: str) -> str:
            """Fetch one page."""
            return run_body(counters, "fetch_page", {"url": url})

        @function_tool
        def lookup_order(order_id: str) -> str:
            """Look up one order."""
            return run_body(counters, "lookup_order", {"order_id": order_id})

        self.model = ScriptedModel([ModelStep.respond(responder) for _ in range(80)])
        self.agent = Agent(
            name=name, model=self.model, instructions="Answer from the documentation.",
            tools=[search_docs, fetch_page, lookup_order],
        )  # fmt: skip

    def partial(self, snapshot: Any) -> str:
        """A partial-answer hook: also notes how many model calls were made at the stop."""
        self.at_stop = self.counters.model_calls
        return f"partial after {snapshot.counters.tool_calls} tool calls"

    def tripwire(self, limits: Limits = NO_LIMITS, **options: Any) -> Tripwire:
        return Tripwire(limits, partial_answer=self.partial, **options)


def _receipts() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


# -- kill switch -------------------------------------------------------------------------------


def test_a_looping_agent_is_stopped_with_a_structured_result() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    out = h.tripwire(on_receipt=sink).run_sync(h.agent, "What is the refund policy?")
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED
    assert isinstance(out.error, LoopDetected) and out.error.tool == LOOP_TOOL
    assert "refund policy" not in out.message
    # No model call after the stop, and the SDK never saw the stop as a tool error.
    assert h.at_stop is not None and h.counters.model_calls == h.at_stop
    assert h.counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED
    assert out.receipt.agent == "looper"
    assert out.partial == f"partial after {out.counters.tool_calls} tool calls"


@needs_g1
def test_the_fourth_identical_call_is_refused_before_its_body_runs() -> None:
    h = Harness(looping)
    out = h.tripwire().run_sync(h.agent, "What is the refund policy?")
    assert isinstance(out, StoppedRun)
    assert h.counters.loop_bodies == 3
    assert h.counters.model_calls == 4  # the 4th call was asked for, then refused


def test_the_stop_reaches_a_plain_runner_as_the_sdks_typed_error() -> None:
    from agents import Runner
    from agents.exceptions import AgentsException

    h = Harness(looping)
    control = h.tripwire().new_run("looper")
    hooks = TripwireHooks(control)
    with pytest.raises(AgentsException) as err:
        Runner.run_sync(
            hooks.guard_agent(h.agent), "q", hooks=hooks, run_config=hooks.run_config(),
            error_handlers=hooks.error_handlers(),  # type: ignore[arg-type]
        )  # fmt: skip
    stop = stopped_run_from(err.value)
    assert isinstance(stop, LoopDetected) and stop is control.stopped
    assert control.stop_result(stop).receipt.reason is StopReason.LOOP_DETECTED


def test_the_callers_agent_and_tools_are_left_as_they_are() -> None:
    h = Harness(looping)
    before = [t.tool_input_guardrails for t in h.agent.tools if isinstance(t, FunctionTool)]
    h.tripwire().run_sync(h.agent, "q")
    after = [t.tool_input_guardrails for t in h.agent.tools if isinstance(t, FunctionTool)]
    assert before == after == [None, None, None]
    assert h.agent.reset_tool_choice is True


def test_an_agent_guarded_for_an_earlier_run_is_judged_by_the_new_run() -> None:
    h = Harness(scripted(healthy_calls()[:2]))
    got, sink = _receipts()
    tw = h.tripwire(on_receipt=sink)
    earlier = TripwireHooks(tw.new_run("looper")).guard_agent(h.agent)
    out = tw.run_sync(earlier, "q")
    assert isinstance(out, RunResult) and out.final_output == "done"
    assert got[0].counters.tool_calls == 2


@needs_g1
@needs_g5
def test_a_stopping_batch_runs_three_bodies_and_nothing_after_the_stop() -> None:
    h = Harness(lambda i, seen, tools: [(LOOP_TOOL, dict(LOOP_ARGS))] * 3)
    out = h.tripwire().run_sync(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert h.counters.loop_bodies == 3
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


@needs_g1
@pytest.mark.parametrize("batch", [4, 6])
def test_a_batch_of_more_than_three_identical_calls_runs_three_bodies(batch: int) -> None:
    # One model response with 4 or 6 identical calls: the SDK checks them all before any
    # body runs, so all of them ran; they take turns now, and the 4th is refused.
    h = Harness(lambda i, seen, tools: [(LOOP_TOOL, dict(LOOP_ARGS))] * batch)
    got, sink = _receipts()
    out = h.tripwire(on_receipt=sink).run_sync(h.agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert h.counters.model_calls == 1 == h.at_stop  # no model call after the stop
    assert got == [out.receipt] and out.receipt.counters.tool_calls == 3


def test_identical_calls_whose_body_raises_take_turns_without_hanging() -> None:
    bodies: list[str] = []

    @function_tool
    def flaky(query: str) -> str:
        """Fails every time."""
        bodies.append(query)
        raise RuntimeError("backend down")

    def responder(call: Any) -> ModelStep:
        if _outputs(call.input):
            return ModelStep(output=[assistant_message("gave up")])
        calls = [function_call("flaky", {"query": "x"}, call_id=f"c{k}") for k in range(2)]
        return ModelStep(output=calls)

    model = ScriptedModel([ModelStep.respond(responder) for _ in range(4)])
    agent = Agent(name="flaky", model=model, tools=[flaky])
    out = asyncio.run(asyncio.wait_for(Tripwire().run(agent, "q"), timeout=30))
    assert isinstance(out, RunResult) and out.final_output == "gave up"
    assert bodies == ["x", "x"]


# -- nudge -------------------------------------------------------------------------------------


@needs_g2
def test_a_model_that_obeys_the_nudge_finishes_untouched() -> None:
    h = Harness(obeys_nudge)
    got, sink = _receipts()
    out = h.tripwire(on_loop="nudge", on_receipt=sink).run_sync(h.agent, "q")
    assert isinstance(out, RunResult)
    assert out.final_output == "I could not find the refund policy."
    assert h.counters.loop_bodies == 3
    # The nudge reached the model as the refused call's output, naming what was repeated.
    assert any(o.startswith(NUDGE_TEXT_START) for o in _outputs(h.model_calls[-1].input))
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call() -> None:
    h = Harness(looping)
    out = h.tripwire(on_loop="nudge").run_sync(h.agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert h.counters.model_calls == 5 == h.at_stop  # nudged at the 4th, killed at the 5th
    assert out.receipt.reason is StopReason.LOOP_DETECTED


# -- healthy runs ------------------------------------------------------------------------------


def test_a_healthy_thirty_call_run_completes_untouched() -> None:
    h = Harness(scripted(healthy_calls()), name="researcher")
    got, sink = _receipts()
    out = h.tripwire(Limits(max_tool_calls=30), on_receipt=sink).run_sync(h.agent, "q")
    assert isinstance(out, RunResult) and out.final_output == "done"
    assert h.counters.tool_bodies == 30 and h.counters.model_calls == 31
    assert got[0].reason is StopReason.COMPLETED
    assert got[0].counters.tool_calls == 30 and got[0].counters.steps == 31
    # Usage came from the SDK's own results (the scripted model emits no model spans).
    assert got[0].counters.input_tokens == 31 * INPUT_TOKENS


@needs_orders_fix
def test_thirty_different_orders_all_shipped_complete_untouched() -> None:
    h = Harness(scripted(order_calls()), name="orders")
    out = h.tripwire().run_sync(h.agent, "q")
    assert isinstance(out, RunResult) and out.final_output == "done"
    assert h.counters.tool_bodies == 30


# -- budgets -----------------------------------------------------------------------------------


def test_a_step_budget_ends_with_the_graceful_last_steps_answer() -> None:
    h = Harness(scripted(healthy_calls()))
    got, sink = _receipts()
    out = h.tripwire(Limits(max_steps=5), on_receipt=sink).run_sync(h.agent, "q")
    assert isinstance(out, RunResult)
    assert out.final_output == "partial: 4 results"
    assert h.counters.model_calls == 5 and h.counters.tool_bodies == 4
    last = h.model_calls[-1]
    assert last.model_settings.tool_choice == "none"  # the last call without tools
    assert "answer now" in (last.system_instructions or "")
    assert all(c.model_settings.tool_choice is None for c in h.model_calls[:-1])
    assert len(got) == 1


@needs_g3
def test_the_graceful_last_step_records_the_limit_as_the_reason() -> None:
    h = Harness(scripted(healthy_calls()))
    got, sink = _receipts()
    h.tripwire(Limits(max_steps=5), on_receipt=sink).run_sync(h.agent, "q")
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def test_a_model_that_ignores_the_wrap_up_is_stopped_with_a_partial_answer() -> None:
    calls = healthy_calls()
    h = Harness(lambda i, seen, tools: [calls[i]])
    out = h.tripwire(Limits(max_steps=3)).run_sync(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert isinstance(out.error, BudgetExceeded) and out.reason is StopReason.MAX_STEPS
    assert h.counters.model_calls == 3 == h.at_stop  # the 4th model call was never made
    assert h.counters.tool_bodies == 2  # the 3rd step's tool call was refused
    assert out.partial == "partial after 2 tool calls"
    assert out.receipt.reason is StopReason.MAX_STEPS


def test_the_sdks_own_max_turns_returns_the_latest_answer_not_an_exception() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    out = Tripwire(loop_policy=None, on_receipt=sink).run_sync(h.agent, "q", max_turns=2)
    assert isinstance(out, RunResult)  # not MaxTurnsExceeded
    assert h.counters.model_calls == 2
    assert got[0].reason is StopReason.MAX_STEPS


def test_the_sdks_max_turns_ends_with_the_graceful_last_steps_answer() -> None:
    # max_turns=3 is the run's step budget: the 3rd model call goes out without tools and
    # its answer is the run's final output (it was "" when the SDK's own cap ended the run).
    h = Harness(scripted(healthy_calls()))
    got, sink = _receipts()
    out = Tripwire(on_receipt=sink).run_sync(h.agent, "q", max_turns=3)
    assert isinstance(out, RunResult)
    assert out.final_output == "partial: 2 results"
    assert h.counters.model_calls == 3 and h.counters.tool_bodies == 2
    assert h.model_calls[-1].model_settings.tool_choice == "none"
    assert "answer now" in (h.model_calls[-1].system_instructions or "")
    assert len(got) == 1 and got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 3, "max_steps": 3}


def test_a_smaller_step_budget_than_max_turns_wins() -> None:
    h = Harness(scripted(healthy_calls()))
    out = h.tripwire(Limits(max_steps=2)).run_sync(h.agent, "q", max_turns=5)
    assert isinstance(out, RunResult) and out.final_output == "partial: 1 results"
    assert h.counters.model_calls == 2


def test_a_users_own_max_turns_handler_wins() -> None:
    h = Harness(looping)

    def mine(data: Any) -> str:
        assert isinstance(data.error, MaxTurnsExceeded)
        return "mine"

    out = Tripwire(loop_policy=None).run_sync(
        h.agent, "q", max_turns=1, error_handlers={"max_turns": mine}
    )
    assert isinstance(out, RunResult) and out.final_output == "mine"


def test_a_token_budget_is_enforced_from_the_sdks_usage() -> None:
    h = Harness(looping)
    out = Tripwire(Limits(max_total_tokens=3 * (INPUT_TOKENS + OUTPUT_TOKENS)), loop_policy=None,
                   partial_answer=h.partial).run_sync(h.agent, "q")  # fmt: skip
    assert isinstance(out, StoppedRun) and out.reason is StopReason.MAX_TOTAL_TOKENS
    assert h.counters.model_calls == 3 == h.at_stop


# -- receipts ----------------------------------------------------------------------------------


@needs_g5
def test_a_receipt_never_claims_a_stop_the_run_went_past() -> None:
    h = Harness(looping)
    out = h.tripwire().run_sync(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


def test_your_own_hooks_still_see_every_event() -> None:
    seen: list[str] = []

    class Mine(RunHooks[Any]):
        async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
            seen.append("llm")

        async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
            seen.append(tool.name)

    h = Harness(scripted(healthy_calls()[:2]))
    h.tripwire().run_sync(h.agent, "q", hooks=Mine())
    assert seen == ["llm", "search_docs", "llm", "fetch_page", "llm"]


def test_a_run_that_crashes_still_hands_over_a_receipt_that_claims_no_end() -> None:
    h = Harness(looping)
    h.model = ScriptedModel([ModelStep.raise_error(RuntimeError("model down"))])
    h.agent = h.agent.clone(model=h.model)
    got, sink = _receipts()
    with pytest.raises(RuntimeError, match="model down"):
        h.tripwire(on_receipt=sink).run_sync(h.agent, "q")
    assert len(got) == 1 and got[0].reason is None and got[0].end is None


# -- two runs at once --------------------------------------------------------------------------


def test_two_runs_in_two_threads_are_judged_separately() -> None:
    tw = Tripwire()
    harnesses = {"loop": Harness(looping), "healthy": Harness(scripted(healthy_calls()))}
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = tw.run_sync(harnesses[name].agent, "q")

    threads = [threading.Thread(target=work, args=(n,)) for n in harnesses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun)
    assert isinstance(results["healthy"], RunResult)
    assert harnesses["healthy"].counters.tool_bodies == 30


async def test_two_runs_in_two_tasks_are_judged_separately() -> None:
    tw = Tripwire()
    loop_h, healthy_h = Harness(looping), Harness(scripted(healthy_calls()))
    loop_out, healthy_out = await asyncio.gather(
        tw.run(loop_h.agent, "q"), tw.run(healthy_h.agent, "q")
    )
    assert isinstance(loop_out, StoppedRun) and loop_out.reason is StopReason.LOOP_DETECTED
    assert isinstance(healthy_out, RunResult) and healthy_out.final_output == "done"
    assert healthy_h.counters.tool_bodies == 30


def test_the_agent_option_names_the_agent_on_receipts() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    h.tripwire(agent="support", on_receipt=sink).run_sync(h.agent, "q")
    assert got[0].agent == "support"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        Tripwire(agent="")
    assert err.value.field == "agent"
    with pytest.raises(ConfigError) as err:
        Tripwire(on_loop="page")
    assert err.value.field == "on_loop"
    with pytest.raises(ConfigError) as err:
        Tripwire(run_id="x")
    assert err.value.field == "run_id"


def test_the_example_runs() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "openai_agents_loop.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "stopped: loop_detected" in out.stdout
    assert "receipt: loop_detected" in out.stdout
