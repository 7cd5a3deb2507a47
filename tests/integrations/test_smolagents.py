"""tripwire in smolagents, on a minimal smolagents ``Model`` subclass (offline, scripted).

Every test counts what really happened: the tool bodies that ran and the model calls the agent
made, not what tripwire says it did.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("smolagents")

from smolagents import CodeAgent, Model, ToolCallingAgent, tool
from smolagents.models import (
    ChatMessage,
    ChatMessageStreamDelta,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import TokenUsage

from tripwire import (
    BudgetExceeded,
    ConfigError,
    Limits,
    LoopDetected,
    RunStopped,
    StopReason,
)
from tripwire.core.budget import NO_LIMITS
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun
from tripwire.integrations.smolagents import GuardedTool, Tripwire

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

Reply = list[tuple[str, dict[str, Any]]] | str
Script = Callable[[int, str, list[str]], Reply]
"""(model call index, the last message's text, the tools offered) -> tool calls or an answer."""

INPUT_TOKENS, OUTPUT_TOKENS = 10, 3


def looping(i: int, last: str, tools: list[str]) -> Reply:
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def obeys_nudge(i: int, last: str, tools: list[str]) -> Reply:
    if NUDGE_TEXT_START in last:
        return "I could not find the refund policy."
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    def script(i: int, last: str, tools: list[str]) -> Reply:
        # The graceful last step: told to answer now (and, when the agent offers tools to the
        # model, offered only final_answer).
        if "answer now" in last or (tools and LOOP_TOOL not in tools):
            return f"partial after {i} calls"
        return [calls[i]] if i < len(calls) else "done"

    return script


def _text(message: Any) -> str:
    content = message.content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


class ScriptedModel(Model):  # type: ignore[misc]
    """The smallest smolagents ``Model``: answers from a script, reports usage, counts calls."""

    def __init__(self, script: Script, counters: Counters, code: bool = False) -> None:
        super().__init__(model_id="scripted-model")
        self.script = script
        self.counters = counters
        self.code = code
        self.requests: list[tuple[list[str], str]] = []

    def generate(self, messages: list[Any], stop_sequences: Any = None,
                 response_format: Any = None, tools_to_call_from: Any = None,
                 **kwargs: Any) -> ChatMessage:  # fmt: skip
        i = self.counters.model() - 1
        tools = [t.name for t in tools_to_call_from or []]
        last = _text(messages[-1]) if messages else ""
        self.requests.append((tools, last))
        reply = self.script(i, last, tools)
        usage = TokenUsage(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS)
        if self.code:
            if isinstance(reply, str):
                code = f"final_answer({reply!r})"
            else:
                code = "\n".join(f"{n}(**{a!r})" for n, a in reply)
            return ChatMessage(role=MessageRole.ASSISTANT, content=f"Thought: go.\n<code>\n{code}\n</code>",
                               token_usage=usage)  # fmt: skip
        if isinstance(reply, str):
            reply = [("final_answer", {"answer": reply})]
        calls = [
            ChatMessageToolCall(id=f"call_{i}_{k}", type="function",
                                function=ChatMessageToolCallFunction(name=n, arguments=a))
            for k, (n, a) in enumerate(reply)
        ]  # fmt: skip
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=calls,
                           token_usage=usage, raw=json.dumps([c.function.name for c in calls]))  # fmt: skip


def _tools(counters: Counters) -> list[Any]:
    @tool
    def search_docs(query: str) -> str:
        """Search the documentation.

        Args:
            query: what to look for.
        """
        return run_body(counters, "search_docs", {"query": query})

    @tool
    def fetch_page(url: str) -> str:
        """Fetch one page.

        Args:
            url: the page address.
        """
        return run_body(counters, "fetch_page", {"url": url})

    @tool
    def lookup_order(order_id: str) -> str:
        """Look up one order.

        Args:
            order_id: the order's id.
        """
        return run_body(counters, "lookup_order", {"order_id": order_id})

    return [search_docs, fetch_page, lookup_order]


class Harness:
    """A smolagents agent on :class:`ScriptedModel` whose tool bodies and model calls are counted."""

    def __init__(self, script: Script, *, code: bool = False, name: str = "looper") -> None:
        self.counters = Counters()
        self.at_stop: int | None = None
        self.model = ScriptedModel(script, self.counters, code=code)
        cls = CodeAgent if code else ToolCallingAgent
        self.agent = cls(tools=_tools(self.counters), model=self.model, name=name,
                         max_steps=60, verbosity_level=0)  # fmt: skip

    def partial(self, snapshot: Any) -> str:
        """A partial-answer hook: also notes how many model calls were made at the stop."""
        self.at_stop = self.counters.model_calls
        return f"partial after {snapshot.counters.tool_calls} tool calls"

    def tripwire(self, limits: Limits = NO_LIMITS, **options: Any) -> Tripwire:
        return Tripwire(limits, partial_answer=self.partial, **options)


def _receipts() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


AGENTS = [pytest.param(False, id="ToolCallingAgent"), pytest.param(True, id="CodeAgent")]

# -- kill switch -------------------------------------------------------------------------------


@pytest.mark.parametrize("code", AGENTS)
def test_a_looping_agent_is_stopped_with_a_structured_result(code: bool) -> None:
    h = Harness(looping, code=code)
    got, sink = _receipts()
    out = h.tripwire(on_receipt=sink).run(h.agent, "What is the refund policy?")
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED
    assert isinstance(out.error, LoopDetected) and out.error.tool == LOOP_TOOL
    # No model call after the stop: smolagents did not turn it into an observation and go on.
    assert h.at_stop is not None and h.counters.model_calls == h.at_stop
    assert h.counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED
    assert out.receipt.agent == "looper"


@needs_g1
@pytest.mark.parametrize("code", AGENTS)
def test_the_fourth_identical_call_is_refused_before_its_body_runs(code: bool) -> None:
    h = Harness(looping, code=code)
    out = h.tripwire().run(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert h.counters.loop_bodies == 3 and h.counters.model_calls == 4


def test_the_stop_propagates_out_of_a_plain_agent_run() -> None:
    h = Harness(looping)
    tw = h.tripwire()
    tw.attach(h.agent)
    with pytest.raises(RunStopped) as err:
        h.agent.run("q")
    assert err.value.reason is StopReason.LOOP_DETECTED
    assert h.counters.model_calls == h.at_stop
    assert tw.stopped_run(h.agent, err.value).receipt.reason is StopReason.LOOP_DETECTED
    # The agent's tools are back after the run, wrapped, final_answer as it was.
    assert all(isinstance(t, GuardedTool) for n, t in h.agent.tools.items() if n != "final_answer")
    assert not isinstance(h.agent.tools["final_answer"], GuardedTool)


@needs_g1
@needs_g5
def test_a_stopping_parallel_batch_runs_three_bodies_and_nothing_after_the_stop() -> None:
    h = Harness(lambda i, last, tools: [(LOOP_TOOL, dict(LOOP_ARGS))] * 3)
    out = h.tripwire().run(h.agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert h.counters.model_calls == 2 == h.at_stop
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


# -- nudge -------------------------------------------------------------------------------------


@needs_g2
@pytest.mark.parametrize("code", AGENTS)
def test_a_model_that_obeys_the_nudge_finishes_untouched(code: bool) -> None:
    h = Harness(obeys_nudge, code=code)
    got, sink = _receipts()
    out = h.tripwire(on_loop="nudge", on_receipt=sink).run(h.agent, "q")
    assert out == "I could not find the refund policy."
    assert h.counters.loop_bodies == 3 and h.counters.model_calls == 5
    assert NUDGE_TEXT_START in h.model.requests[-1][1]  # the model saw the nudge
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call() -> None:
    h = Harness(looping)
    out = h.tripwire(on_loop="nudge").run(h.agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.loop_bodies == 3
    assert h.counters.model_calls == 5 == h.at_stop
    assert out.receipt.reason is StopReason.LOOP_DETECTED


# -- healthy runs ------------------------------------------------------------------------------


@pytest.mark.parametrize("code", AGENTS)
def test_a_healthy_thirty_call_run_completes_untouched(code: bool) -> None:
    h = Harness(scripted(healthy_calls()), code=code, name="researcher")
    got, sink = _receipts()
    out = h.tripwire(Limits(max_tool_calls=30), on_receipt=sink).run(h.agent, "q")
    assert out == "done"
    assert h.counters.tool_bodies == 30 and h.counters.model_calls == 31
    assert got[0].reason is StopReason.COMPLETED
    assert got[0].counters.tool_calls == 30 and got[0].counters.steps == 31
    # Usage came from smolagents' own steps (a custom Model emits no model spans).
    assert got[0].counters.input_tokens == 31 * INPUT_TOKENS


@needs_orders_fix
def test_thirty_different_orders_all_shipped_complete_untouched() -> None:
    h = Harness(scripted(order_calls()), name="orders")
    out = h.tripwire().run(h.agent, "q")
    assert out == "done"
    assert h.counters.tool_bodies == 30


# -- budgets -----------------------------------------------------------------------------------


def test_a_step_budget_ends_with_the_graceful_last_steps_answer() -> None:
    h = Harness(scripted(healthy_calls()))
    got, sink = _receipts()
    out = h.tripwire(Limits(max_steps=5), on_receipt=sink).run(h.agent, "q")
    assert out == "partial after 4 calls"
    assert h.counters.model_calls == 5 and h.counters.tool_bodies == 4
    tools, last = h.model.requests[-1]
    assert tools == ["final_answer"] and "answer now" in last  # no tools, and told to wrap up
    assert all(LOOP_TOOL in t for t, _ in h.model.requests[:-1])
    assert len(got) == 1
    # The agent got its tools back.
    assert set(h.agent.tools) == {"search_docs", "fetch_page", "lookup_order", "final_answer"}


@needs_g3
def test_the_graceful_last_step_records_the_limit_as_the_reason() -> None:
    h = Harness(scripted(healthy_calls()))
    got, sink = _receipts()
    h.tripwire(Limits(max_steps=5), on_receipt=sink).run(h.agent, "q")
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def test_a_code_agent_that_ignores_the_wrap_up_is_stopped_with_a_partial_answer() -> None:
    calls = healthy_calls()
    h = Harness(lambda i, last, tools: [calls[i]], code=True)
    out = h.tripwire(Limits(max_steps=3)).run(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert isinstance(out.error, BudgetExceeded) and out.reason is StopReason.MAX_STEPS
    assert h.counters.model_calls == 3 == h.at_stop  # the 4th model call was never made
    assert h.counters.tool_bodies == 2  # the 3rd step's tool call was refused
    assert out.partial == "partial after 2 tool calls"
    assert out.receipt.reason is StopReason.MAX_STEPS


def test_smolagents_own_max_steps_keeps_its_final_answer_and_says_max_steps() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    out = Tripwire(loop_policy=None, on_receipt=sink).run(h.agent, "q", max_steps=2)
    assert not isinstance(out, StoppedRun)
    assert h.counters.model_calls == 3  # 2 steps, then smolagents' own tool-less final answer
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].counters.steps == 3


def test_a_token_budget_is_enforced_from_the_steps_usage() -> None:
    h = Harness(looping)
    out = Tripwire(Limits(max_total_tokens=3 * (INPUT_TOKENS + OUTPUT_TOKENS)), loop_policy=None,
                   partial_answer=h.partial).run(h.agent, "q")  # fmt: skip
    assert isinstance(out, StoppedRun) and out.reason is StopReason.MAX_TOTAL_TOKENS
    assert h.counters.model_calls == 3 == h.at_stop


@pytest.mark.parametrize("code", AGENTS)
def test_a_token_budget_refuses_the_tools_of_the_step_that_crossed_it(code: bool) -> None:
    # The usage is recorded when the model call returns, before its step's tools run: the
    # tool the 3rd call asked for is refused (it ran, and the stop came after it).
    h = Harness(looping, code=code)
    got, sink = _receipts()
    out = Tripwire(Limits(max_total_tokens=3 * (INPUT_TOKENS + OUTPUT_TOKENS)), loop_policy=None,
                   on_receipt=sink).run(h.agent, "q")  # fmt: skip
    assert isinstance(out, StoppedRun) and out.reason is StopReason.MAX_TOTAL_TOKENS
    assert h.counters.model_calls == 3 and h.counters.loop_bodies == 2
    assert got[0].counters.input_tokens == 3 * INPUT_TOKENS
    assert not got[0].after_stop.active  # type: ignore[attr-defined]


# -- receipts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("code", AGENTS)
def test_a_refusal_that_ends_the_run_keeps_the_last_steps_tokens(code: bool) -> None:
    # The 4th model call asked for the call that was refused and ended the run: its tokens
    # were missing from the receipt (30 input tokens for 4 model calls).
    h = Harness(looping, code=code)
    got, sink = _receipts()
    out = h.tripwire(on_receipt=sink).run(h.agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert h.counters.model_calls == 4 and h.counters.loop_bodies == 3
    counters = got[0].counters
    assert counters.steps == 4
    assert (counters.input_tokens, counters.output_tokens) == (4 * INPUT_TOKENS, 4 * OUTPUT_TOKENS)
    assert not got[0].after_stop.active  # type: ignore[attr-defined]
    assert isinstance(h.agent.model, ScriptedModel)  # the agent's model, as far as anyone asks


class StreamingModel(ScriptedModel):
    """The scripted model, streamed: the code in two deltas, usage on each (as providers do)."""

    def generate_stream(self, messages: list[Any], **kwargs: Any) -> Iterator[Any]:
        message = self.generate(messages, **kwargs)
        text = message.content
        half = len(text) // 2
        yield ChatMessageStreamDelta(content=text[:half],
                                     token_usage=TokenUsage(input_tokens=INPUT_TOKENS, output_tokens=1))
        yield ChatMessageStreamDelta(content=text[half:], token_usage=TokenUsage(
            input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS - 1))  # fmt: skip


def test_a_streamed_model_call_is_counted_when_its_stream_ends() -> None:
    counters = Counters()
    model = StreamingModel(looping, counters, code=True)
    agent = CodeAgent(tools=_tools(counters), model=model, max_steps=60, verbosity_level=0,
                      stream_outputs=True)  # fmt: skip
    got, sink = _receipts()
    out = Tripwire(on_receipt=sink).run(agent, "q")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.model_calls == 4 and counters.loop_bodies == 3
    assert (got[0].counters.input_tokens, got[0].counters.output_tokens) == (40, 12)


def test_a_plain_agent_run_keeps_the_last_steps_tokens_too() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    tw = h.tripwire(on_receipt=sink)
    tw.attach(h.agent)
    with pytest.raises(RunStopped) as err:
        h.agent.run("q")
    out = tw.stopped_run(h.agent, err.value)
    assert out.receipt.counters.input_tokens == 4 * INPUT_TOKENS == h.counters.model_calls * 10
    assert got == [out.receipt]




@needs_g5
def test_a_receipt_never_claims_a_stop_the_run_went_past() -> None:
    h = Harness(looping)
    out = h.tripwire().run(h.agent, "q")
    assert isinstance(out, StoppedRun)
    assert not out.receipt.after_stop.active  # type: ignore[attr-defined]


def test_every_run_of_one_agent_gets_its_own_guard_and_receipt() -> None:
    h = Harness(scripted(healthy_calls()[:2]))
    got, sink = _receipts()
    tw = h.tripwire(on_receipt=sink)
    assert tw.run(h.agent, "q") == "done"
    h.counters.model_calls = 0  # the script restarts
    assert tw.run(h.agent, "q") == "done"
    assert [r.counters.tool_calls for r in got] == [2, 2]
    assert got[0].run_id != got[1].run_id


def test_a_run_that_crashes_still_hands_over_a_receipt_that_claims_no_end() -> None:
    def broken(i: int, last: str, tools: list[str]) -> Reply:
        raise RuntimeError("model down")

    h = Harness(broken)
    got, sink = _receipts()
    with pytest.raises(Exception, match="model down"):
        h.tripwire(on_receipt=sink).run(h.agent, "q")
    assert len(got) == 1 and got[0].reason is None and got[0].end is None


# -- two runs at once --------------------------------------------------------------------------


def test_two_runs_in_two_threads_are_judged_separately() -> None:
    tw = Tripwire()
    harnesses = {"loop": Harness(looping), "healthy": Harness(scripted(healthy_calls()))}
    results: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = tw.run(harnesses[name].agent, "q")

    threads = [threading.Thread(target=work, args=(n,)) for n in harnesses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun)
    assert results["healthy"] == "done"
    assert harnesses["healthy"].counters.tool_bodies == 30


async def test_two_runs_in_two_tasks_are_judged_separately() -> None:
    tw = Tripwire()
    loop_h, healthy_h = Harness(looping), Harness(scripted(healthy_calls()))
    loop_out, healthy_out = await asyncio.gather(
        asyncio.to_thread(tw.run, loop_h.agent, "q"),
        asyncio.to_thread(tw.run, healthy_h.agent, "q"),
    )
    assert isinstance(loop_out, StoppedRun) and loop_out.reason is StopReason.LOOP_DETECTED
    assert healthy_out == "done" and healthy_h.counters.tool_bodies == 30


def test_the_agent_option_names_the_agent_on_receipts() -> None:
    h = Harness(looping)
    got, sink = _receipts()
    h.tripwire(agent="support", on_receipt=sink).run(h.agent, "q")
    assert got[0].agent == "support"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        Tripwire(agent="")
    assert err.value.field == "agent"
    with pytest.raises(ConfigError) as err:
        Tripwire(on_loop="page")
    assert err.value.field == "on_loop"
    h = Harness(looping)
    with pytest.raises(ConfigError) as err:
        Tripwire().run(h.agent, "q", stream=True)
    assert err.value.field == "stream"


def test_the_example_runs() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "smolagents_loop.py")],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "stopped: loop_detected" in out.stdout
    assert "receipt: loop_detected" in out.stdout
