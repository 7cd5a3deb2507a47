"""The plain tool loop, guarded: "call the model, run the tools, repeat", with no framework.

For the OpenAI and Anthropic client shapes (``client.chat.completions.create`` and
``client.messages.create``), the loop everyone writes by hand, with tripwire around each
model call and each tool call::

    from openai import OpenAI
    from tripwire import Limits
    from tripwire.integrations.loop import run_openai

    out = run_openai(OpenAI(), model="gpt-4o-mini", messages=[...], tools=[...],
                     functions={"search_docs": search_docs}, limits=Limits(max_steps=20))
    print(out.output)           # a LoopResult, or a StoppedRun when tripwire ended the run

``functions`` maps each tool name to the Python function that runs it (called with the
model's arguments as keywords). A tool that raises is reported to the model as an error
result, and to the loop watcher as a failure. The 4th identical call is refused before its
function runs; in nudge mode the nudge goes back to the model as that call's result. On the
graceful last step the model is called without tools and told to wrap up; its answer is the
run's output.

The client is used as given: nothing here opens a connection, and the calls are made on the
caller's thread. The clients need not be the ``openai``/``anthropic`` packages' own; anything
with the same method and response shape works.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tripwire.core.budget import NO_LIMITS, Limits
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.core.receipt import StopReceipt
from tripwire.errors import ConfigError, RunStopped
from tripwire.integrations._common import (
    OnLoop,
    PartialAnswer,
    ReceiptSink,
    RunControl,
    StoppedRun,
    new_run,
)

__all__ = ["LoopResult", "run_anthropic", "run_openai"]

DEFAULT_MAX_TURNS = 100
"""A backstop for a loop with no step limit: the most model calls one run makes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopResult:
    """A run that ended by itself: the model's final answer."""

    output: str
    """The model's final text."""
    messages: tuple[Any, ...]
    """The whole conversation, in the client's own message format."""
    receipt: StopReceipt
    """The run's receipt (also handed to ``on_receipt``)."""


@dataclass(frozen=True, slots=True)
class _Call:
    id: str
    name: str
    arguments: Any
    """The arguments as the model gave them (a dict; or the raw text when it was not JSON)."""


def _field(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _run_tool(run: RunControl, functions: Mapping[str, Callable[..., Any]], call: _Call) -> str:
    """Check, run and record one tool call; returns the text for the model."""
    refusal = run.before_tool(call.name, call.arguments)
    if refusal is not None:
        return refusal
    fn = functions.get(call.name)
    try:
        if fn is None:
            raise LookupError(f"no function for tool {call.name!r}")
        if not isinstance(call.arguments, dict):
            raise TypeError("the arguments are not a JSON object")
        result = fn(**call.arguments)
    except RunStopped:
        raise
    except Exception as exc:
        run.after_tool(call.name, call.arguments, error=exc)
        return f"Error: {type(exc).__name__}: {exc}"
    run.after_tool(call.name, call.arguments, result)
    return result if isinstance(result, str) else json.dumps(result, default=str)


def _start(
    functions: Mapping[str, Callable[..., Any]],
    limits: Limits,
    loop_policy: LoopPolicy | None,
    on_loop: OnLoop | str,
    agent: str,
    on_receipt: ReceiptSink | None,
    partial_answer: PartialAnswer | None,
    max_turns: int,
    guard_options: dict[str, Any],
) -> RunControl:
    if not isinstance(functions, Mapping) or not all(callable(f) for f in functions.values()):
        raise ConfigError("functions", functions, "a mapping of tool name to function")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ConfigError("max_turns", max_turns, "an integer >= 1")
    if limits.max_steps is None:
        limits = replace(limits, max_steps=max_turns)
    return new_run(
        limits,
        loop_policy=loop_policy,
        on_loop=on_loop,
        agent=agent,
        on_receipt=on_receipt,
        partial_answer=partial_answer,
        **guard_options,
    )


# -- OpenAI chat completions -------------------------------------------------------------------


def _openai_calls(message: Any) -> list[_Call]:
    calls = []
    for tc in _field(message, "tool_calls") or []:
        fn = _field(tc, "function")
        raw = _field(fn, "arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = raw
        calls.append(_Call(str(_field(tc, "id") or ""), str(_field(fn, "name") or ""), arguments))
    return calls


def _openai_assistant(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        dumped: dict[str, Any] = message.model_dump(exclude_none=True)
        return dumped
    return dict(message)


def run_openai(
    client: Any,
    *,
    model: str,
    messages: Sequence[Any],
    tools: Sequence[Any] = (),
    functions: Mapping[str, Callable[..., Any]],
    limits: Limits = NO_LIMITS,
    loop_policy: LoopPolicy | None = DEFAULT_POLICY,
    on_loop: OnLoop | str = OnLoop.STOP,
    agent: str = "agent",
    on_receipt: ReceiptSink | None = None,
    partial_answer: PartialAnswer | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    """Run the tool loop on an OpenAI-shaped client (``client.chat.completions.create``).

    Args:
        client: ``openai.OpenAI()`` or anything with the same method and response shape.
        model, messages, tools: as for ``chat.completions.create``; ``messages`` is copied.
        functions: tool name → the function that runs it.
        limits, loop_policy, on_loop, agent, on_receipt, partial_answer: as for
            :func:`~tripwire.integrations.new_run`.
        max_turns: the step limit when ``limits`` has none (a backstop, not a loop detector).
        guard_options: further :class:`~tripwire.guard.Guard` options.
        **create: further arguments for every ``create`` call (``temperature``…).

    Returns:
        A :class:`LoopResult` when the model answered, a
        :class:`~tripwire.integrations.StoppedRun` when tripwire ended the run.
    """
    run = _start(functions, limits, loop_policy, on_loop, agent, on_receipt, partial_answer,
                 max_turns, dict(guard_options or {}))  # fmt: skip
    history: list[Any] = list(messages)
    try:
        while True:
            run.before_model()
            wrap = run.wrap_up()
            kwargs = dict(create)
            if wrap is None and tools:
                kwargs["tools"] = list(tools)
            sent = [*history, {"role": "user", "content": wrap}] if wrap else history
            response = client.chat.completions.create(model=model, messages=sent, **kwargs)
            usage = _field(response, "usage")
            message = _field(_field(response, "choices")[0], "message")
            calls = _openai_calls(message)
            text = _field(message, "content") or ""
            if not calls:
                run.note_answer(text)
            run.after_model(
                model=_field(response, "model") or model,
                input_tokens=_field(usage, "prompt_tokens", 0),
                output_tokens=_field(usage, "completion_tokens", 0),
                provider="openai",
            )
            history = [*sent, _openai_assistant(message)]
            if not calls:
                receipt = run.finish(text)
                return LoopResult(output=text, messages=tuple(history), receipt=receipt)
            for call in calls:
                content = _run_tool(run, functions, call)
                history.append({"role": "tool", "tool_call_id": call.id, "content": content})
    except RunStopped as exc:
        return run.stop_result(exc)


# -- Anthropic messages ------------------------------------------------------------------------


def _anthropic_blocks(response: Any) -> tuple[str, list[_Call], list[Any]]:
    texts: list[str] = []
    calls: list[_Call] = []
    blocks: list[Any] = []
    for block in _field(response, "content") or []:
        kind = _field(block, "type")
        if kind == "text":
            texts.append(str(_field(block, "text") or ""))
        elif kind == "tool_use":
            calls.append(
                _Call(
                    str(_field(block, "id") or ""),
                    str(_field(block, "name") or ""),
                    _field(block, "input") or {},
                )
            )
        blocks.append(
            block.model_dump(exclude_none=True) if hasattr(block, "model_dump") else block
        )
    return "".join(texts), calls, blocks


def _with_user_text(history: list[Any], text: str) -> list[Any]:
    """``history`` with ``text`` added to the last user turn (Anthropic turns alternate)."""
    if history and _field(history[-1], "role") == "user":
        last = dict(history[-1])
        content = last.get("content")
        blocks = (
            [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        )
        last["content"] = [*blocks, {"type": "text", "text": text}]
        return [*history[:-1], last]
    return [*history, {"role": "user", "content": text}]


def run_anthropic(
    client: Any,
    *,
    model: str,
    messages: Sequence[Any],
    max_tokens: int = 1024,
    tools: Sequence[Any] = (),
    functions: Mapping[str, Callable[..., Any]],
    limits: Limits = NO_LIMITS,
    loop_policy: LoopPolicy | None = DEFAULT_POLICY,
    on_loop: OnLoop | str = OnLoop.STOP,
    agent: str = "agent",
    on_receipt: ReceiptSink | None = None,
    partial_answer: PartialAnswer | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    """Run the tool loop on an Anthropic-shaped client (``client.messages.create``).

    Arguments and result as for :func:`run_openai`; ``max_tokens`` is passed to every call.
    """
    run = _start(functions, limits, loop_policy, on_loop, agent, on_receipt, partial_answer,
                 max_turns, dict(guard_options or {}))  # fmt: skip
    history: list[Any] = list(messages)
    try:
        while True:
            run.before_model()
            wrap = run.wrap_up()
            kwargs = dict(create)
            if wrap is None and tools:
                kwargs["tools"] = list(tools)
            sent = _with_user_text(history, wrap) if wrap else history
            response = client.messages.create(
                model=model, max_tokens=max_tokens, messages=sent, **kwargs
            )
            usage = _field(response, "usage")
            text, calls, blocks = _anthropic_blocks(response)
            if not calls:
                run.note_answer(text)
            run.after_model(
                model=_field(response, "model") or model,
                input_tokens=_field(usage, "input_tokens", 0),
                output_tokens=_field(usage, "output_tokens", 0),
                provider="anthropic",
            )
            history = [*sent, {"role": "assistant", "content": blocks}]
            if not calls:
                receipt = run.finish(text)
                return LoopResult(output=text, messages=tuple(history), receipt=receipt)
            results = []
            for call in calls:
                content = _run_tool(run, functions, call)
                results.append({"type": "tool_result", "tool_use_id": call.id, "content": content})
            history.append({"role": "user", "content": results})
    except RunStopped as exc:
        return run.stop_result(exc)
