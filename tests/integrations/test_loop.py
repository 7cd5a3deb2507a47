"""The plain tool loop on scripted clients with the real clients' method and response types
(``openai.types.chat.ChatCompletion``, ``anthropic.types.Message``); tool bodies and model
calls are counted."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import pytest
import tomllib

pytest.importorskip("openai")
pytest.importorskip("anthropic")

from anthropic.types import Message
from openai.types.chat import ChatCompletion

from tripwire import BudgetExceeded, ConfigError, Limits, LoopDetected, StopReason
from tripwire.config import load_config
from tripwire.core.policy import LoopPolicy, Poll
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import StoppedRun
from tripwire.integrations.loop import (
    LoopResult,
    arun_anthropic,
    arun_openai,
    run_anthropic,
    run_openai,
)

from .agent_scripts import Script, looping, obeys_nudge, scripted, stubborn
from .scripts import Counters, healthy_calls, order_calls, run_body
from .xfails import needs_g1, needs_g2, needs_g3, orders_flagged

pytestmark = pytest.mark.filterwarnings("ignore::tripwire.prices.CostNotFoundWarning")

TOOL_NAMES = ("search_docs", "fetch_page", "lookup_order")


class _Completions:
    def __init__(self, owner: ScriptedOpenAI) -> None:
        self.owner = owner

    def create(self, *, model: str, messages: list[Any], tools: Any = None, **kw: Any) -> Any:
        o = self.owner
        i = o.counters.model() - 1
        o.requests.append({"messages": list(messages), "tools": tools, "kw": kw})
        seen = [m["content"] for m in messages if isinstance(m, dict) and m.get("role") == "tool"]
        reply = o.script(i, seen, bool(tools))
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "tool_calls"
        if isinstance(reply, str):
            message["content"], finish = reply, "stop"
        else:
            message["tool_calls"] = [
                {"id": f"call_{i}_{j}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for j, (name, args) in enumerate(reply)
            ]  # fmt: skip
        return ChatCompletion.model_validate(
            {
                "id": f"chatcmpl-{i}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            }
        )


class ScriptedOpenAI:
    """``client.chat.completions.create`` answering from a script, as ``ChatCompletion``."""

    def __init__(self, script: Script, counters: Counters) -> None:
        self.script, self.counters = script, counters
        self.requests: list[dict[str, Any]] = []
        self.chat = type("Chat", (), {})()
        self.chat.completions = _Completions(self)


class _Messages:
    def __init__(self, owner: ScriptedAnthropic) -> None:
        self.owner = owner

    def create(
        self, *, model: str, max_tokens: int, messages: list[Any], tools: Any = None, **kw: Any
    ) -> Any:
        o = self.owner
        i = o.counters.model() - 1
        o.requests.append({"messages": list(messages), "tools": tools, "kw": kw})
        seen = [
            b["content"]
            for m in messages
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b.get("type") == "tool_result"
        ]
        reply = o.script(i, seen, bool(tools))
        if isinstance(reply, str):
            content: list[dict[str, Any]] = [{"type": "text", "text": reply}]
            stop = "end_turn"
        else:
            content = [
                {"type": "tool_use", "id": f"toolu_{i}_{j}", "name": name, "input": args}
                for j, (name, args) in enumerate(reply)
            ]
            stop = "tool_use"
        return Message.model_validate(
            {
                "id": f"msg_{i}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": content,
                "stop_reason": stop,
                "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 3},
            }
        )


class ScriptedAnthropic:
    """``client.messages.create`` answering from a script, as ``anthropic.types.Message``."""

    def __init__(self, script: Script, counters: Counters) -> None:
        self.script, self.counters = script, counters
        self.requests: list[dict[str, Any]] = []
        self.messages = _Messages(self)


CLIENTS = ["openai", "anthropic"]


def run(kind: str, script: Script, counters: Counters, **options: Any) -> tuple[Any, Any]:
    got: list[StopReceipt] = []
    options.setdefault("on_receipt", got.append)
    functions = {
        name: (lambda n: lambda **kw: run_body(counters, n, kw))(name) for name in TOOL_NAMES
    }
    prompt = [{"role": "user", "content": "What is the refund policy?"}]
    if kind == "openai":
        client: Any = ScriptedOpenAI(script, counters)
        tools = [{"type": "function", "function": {"name": n}} for n in TOOL_NAMES]
        out = run_openai(client, model="gpt-4o-mini", messages=prompt, tools=tools,
                         functions=functions, **options)  # fmt: skip
    else:
        client = ScriptedAnthropic(script, counters)
        tools = [{"name": n, "input_schema": {"type": "object"}} for n in TOOL_NAMES]
        out = run_anthropic(client, model="claude-haiku-4-5", messages=prompt, tools=tools,
                            functions=functions, **options)  # fmt: skip
    out_receipts = got
    return out, (client, out_receipts)


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_looping_model_is_stopped_with_a_structured_result(kind: str) -> None:
    counters = Counters()
    out, (_, got) = run(kind, looping, counters)
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED and isinstance(out.error, LoopDetected)
    assert counters.model_calls == out.counters.steps  # no model call after the stop
    assert counters.loop_bodies <= 4
    assert got == [out.receipt] and out.receipt.reason is StopReason.LOOP_DETECTED


@needs_g1
@pytest.mark.parametrize("kind", CLIENTS)
def test_the_fourth_identical_call_never_runs(kind: str) -> None:
    counters = Counters()
    run(kind, looping, counters)
    assert counters.loop_bodies == 3


@needs_g2
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_model_that_obeys_the_nudge_finishes(kind: str) -> None:
    counters = Counters()
    out, (_, got) = run(kind, obeys_nudge, counters, on_loop="nudge")
    assert isinstance(out, LoopResult) and out.output == "I could not find the refund policy."
    assert counters.loop_bodies == 3 and got[0].reason is StopReason.COMPLETED


@needs_g2
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call(kind: str) -> None:
    counters = Counters()
    out, _ = run(kind, looping, counters, on_loop="nudge")
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.loop_bodies == 3 and counters.model_calls == out.counters.steps


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_healthy_thirty_call_run_completes_untouched(kind: str) -> None:
    counters = Counters()
    out, (client, got) = run(kind, scripted(healthy_calls()), counters)
    assert isinstance(out, LoopResult) and out.output == "done"
    assert counters.tool_bodies == 30 and counters.model_calls == 31
    assert got == [out.receipt] and out.receipt.reason is StopReason.COMPLETED
    assert out.receipt.counters.input_tokens == 310
    assert all(r["tools"] for r in client.requests)


@orders_flagged
@pytest.mark.parametrize("kind", CLIENTS)
def test_thirty_different_orders_all_shipped_complete_untouched(kind: str) -> None:
    counters = Counters()
    out, _ = run(kind, scripted(order_calls()), counters)
    assert isinstance(out, LoopResult) and counters.tool_bodies == 30


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_tool_call_cap_never_refuses_the_final_answer(kind: str) -> None:
    counters = Counters()
    out, _ = run(kind, scripted(healthy_calls()), counters, limits=Limits(max_tool_calls=30))
    assert isinstance(out, LoopResult) and out.output == "done"


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_step_budget_ends_with_the_graceful_last_step(kind: str) -> None:
    counters = Counters()
    out, (client, got) = run(kind, scripted(healthy_calls()), counters, limits=Limits(max_steps=5))
    assert isinstance(out, LoopResult) and out.output == "partial: 4 results"
    assert counters.model_calls == 5 and counters.tool_bodies == 4
    last = client.requests[-1]
    assert last["tools"] is None  # the last call went out without tools...
    assert "last step" in json.dumps(last["messages"][-1])  # ...and with the wrap-up text
    assert len(got) == 1


@needs_g3
@pytest.mark.parametrize("kind", CLIENTS)
def test_the_graceful_last_step_is_recorded_as_the_limit(kind: str) -> None:
    out, _ = run(kind, scripted(healthy_calls()), Counters(), limits=Limits(max_steps=5))
    assert out.receipt.reason is StopReason.MAX_STEPS
    assert out.receipt.condition == {"steps": 5, "max_steps": 5}  # filled, never {}


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_model_that_ignores_the_wrap_up_gets_the_partial_answer(kind: str) -> None:
    counters = Counters()
    out, _ = run(
        kind,
        stubborn(healthy_calls()),
        counters,
        limits=Limits(max_steps=3),
        partial_answer=lambda snap: f"{snap.counters.tool_calls} calls made",
    )
    assert isinstance(out, StoppedRun) and isinstance(out.error, BudgetExceeded)
    assert out.reason is StopReason.MAX_STEPS and out.partial == "2 calls made"
    assert counters.model_calls == 3 and counters.tool_bodies == 2
    assert out.receipt.reason is StopReason.MAX_STEPS


@pytest.mark.parametrize("kind", CLIENTS)
def test_a_tool_error_goes_back_to_the_model(kind: str) -> None:
    counters = Counters()
    script = scripted([("no_such_tool", {}), ("search_docs", {"query": "billing policy"})])
    out, (client, _) = run(kind, script, counters)
    assert isinstance(out, LoopResult) and out.output == "done"
    assert "LookupError" in json.dumps(client.requests[1]["messages"])
    assert counters.tool_bodies == 1


@pytest.mark.parametrize("kind", CLIENTS)
def test_two_runs_in_threads_are_judged_separately(kind: str) -> None:
    results: dict[str, Any] = {}
    counters = {"loop": Counters(), "healthy": Counters()}
    scripts = {"loop": looping, "healthy": scripted(healthy_calls())}
    barrier = threading.Barrier(2)

    def work(name: str) -> None:
        barrier.wait()
        results[name] = run(kind, scripts[name], counters[name])[0]

    threads = [threading.Thread(target=work, args=(n,)) for n in scripts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun)
    assert isinstance(results["healthy"], LoopResult) and counters["healthy"].tool_bodies == 30


@pytest.mark.parametrize("kind", CLIENTS)
def test_prices_none_is_taken_as_every_other_adapter_takes_it(kind: str) -> None:
    # prices=None reached the client's create() as an unknown argument (the real clients
    # raise TypeError on it), and the run's cost was still priced from the table.
    priced, _ = run(kind, scripted(healthy_calls(2)), Counters())
    assert priced.receipt.counters.cost_usd  # the price table knows the scripted models
    counters = Counters()
    out, (client, got) = run(kind, scripted(healthy_calls(2)), counters, prices=None)
    assert isinstance(out, LoopResult)
    assert all("prices" not in r["kw"] for r in client.requests)
    assert counters.model_calls == 3 and counters.tool_bodies == 2
    assert got[0].counters.cost_usd is None and got[0].counters.steps == 3


@pytest.mark.parametrize("kind", CLIENTS)
def test_the_old_guard_options_spelling_still_works_with_a_warning(kind: str) -> None:
    counters = Counters()
    with pytest.warns(DeprecationWarning, match="prices="):
        out, (client, got) = run(kind, scripted(healthy_calls(2)), counters,
                                 guard_options={"prices": None})  # fmt: skip
    assert isinstance(out, LoopResult) and got[0].counters.cost_usd is None
    assert all("guard_options" not in r["kw"] for r in client.requests)


def test_a_stopped_polls_message_advises_declaring_it_in_valid_toml(tmp_path: Any) -> None:
    # One advice everywhere (the stop's message said to raise the threshold), and its TOML,
    # for a tool name with a dot and a slash, parses and loads as written.
    def polls(i: int, seen: list[str], tools: bool) -> Any:
        return [("./mvnw", {"goal": "verify"})] if len(seen) < 6 else "BUILD SUCCESS"

    def build(counters: Counters, **options: Any) -> Any:
        def mvnw(**kw: Any) -> str:
            counters.tool("./mvnw", kw)
            return "BUILD RUNNING"

        client = ScriptedOpenAI(polls, counters)
        return run_openai(client, model="gpt-4o-mini", messages=[{"role": "user", "content": "q"}],
                          tools=[{"type": "function", "function": {"name": "./mvnw"}}],
                          functions={"./mvnw": mvnw}, prices=None, **options)  # fmt: skip

    counters = Counters()
    out = build(counters)
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.tool_bodies == 3 and counters.model_calls == 4
    assert "threshold" not in out.message and "declare it" in out.message
    advised = out.message[out.message.index("[policy.polls."):]
    assert tomllib.loads(advised) == {
        "policy": {"polls": {"./mvnw": {"interval_s": 10, "max_wait_s": 600}}}
    }
    path = tmp_path / "tripwire.toml"
    path.write_text(f"version = 1\n\n{advised}\n", encoding="utf-8")  # into the user's file
    config = load_config({"config": path}, env={})
    assert config.policy.polls == {"./mvnw": Poll(interval_s=10, max_wait_s=600)}
    python = re.search(r"LoopPolicy\(polls=\{.*?\}\)", out.message)
    assert python is not None
    assert eval(python.group(0), {"LoopPolicy": LoopPolicy, "Poll": Poll}).polls == config.policy.polls
    # Following the advice, the same poll waits and the run finishes.
    counters = Counters()
    done = build(counters, loop_policy=config.policy)
    assert isinstance(done, LoopResult) and done.output == "BUILD SUCCESS"
    assert counters.tool_bodies == 6


def test_bad_settings_name_the_field() -> None:
    client = ScriptedOpenAI(looping, Counters())
    with pytest.raises(ConfigError) as err:
        run_openai(client, model="m", messages=[], functions={"a": "not callable"})  # type: ignore[dict-item]
    assert err.value.field == "functions"
    with pytest.raises(ConfigError) as err:
        run_openai(client, model="m", messages=[], functions={}, max_turns=0)
    assert err.value.field == "max_turns"


class _Async:
    """The async client (``AsyncOpenAI`` / ``AsyncAnthropic``) shape over a scripted one."""

    def __init__(self, sync: Any, path: str) -> None:
        create = sync
        for part in path.split("."):
            create = getattr(create, part)

        async def acreate(**kwargs: Any) -> Any:
            await asyncio.sleep(0)  # let the other task run between model calls
            return create(**kwargs)

        holder: Any = self
        *parents, last = path.split(".")
        for part in parents:
            child = type(part, (), {})()
            setattr(holder, part, child)
            holder = child
        setattr(holder, last, acreate)


async def _arun(kind: str, script: Script, counters: Counters) -> Any:
    async def search_docs(query: str) -> str:  # an async tool function
        await asyncio.sleep(0)
        return run_body(counters, "search_docs", {"query": query})

    functions: dict[str, Any] = {"search_docs": search_docs}
    for name in ("fetch_page", "lookup_order"):
        functions[name] = (lambda n: lambda **kw: run_body(counters, n, kw))(name)
    prompt = [{"role": "user", "content": "q"}]
    if kind == "openai":
        client = _Async(ScriptedOpenAI(script, counters), "chat.completions.create")
        tools = [{"type": "function", "function": {"name": n}} for n in TOOL_NAMES]
        return await arun_openai(client, model="gpt-4o-mini", messages=prompt, tools=tools,
                                 functions=functions)  # fmt: skip
    client = _Async(ScriptedAnthropic(script, counters), "messages.create")
    tools = [{"name": n, "input_schema": {"type": "object"}} for n in TOOL_NAMES]
    return await arun_anthropic(client, model="claude-haiku-4-5", messages=prompt, tools=tools,
                                functions=functions)  # fmt: skip


@pytest.mark.parametrize("kind", CLIENTS)
async def test_two_async_runs_in_tasks_are_judged_separately(kind: str) -> None:
    loop_counters, healthy_counters = Counters(), Counters()
    loop_out, healthy_out = await asyncio.gather(
        _arun(kind, looping, loop_counters),
        _arun(kind, scripted(healthy_calls()), healthy_counters),
    )
    assert isinstance(loop_out, StoppedRun) and loop_out.reason is StopReason.LOOP_DETECTED
    assert loop_counters.model_calls == loop_out.counters.steps
    assert isinstance(healthy_out, LoopResult) and healthy_out.output == "done"
    assert healthy_counters.tool_bodies == 30
