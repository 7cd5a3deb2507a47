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

``arun_openai`` and ``arun_anthropic`` do the same on the async clients (``AsyncOpenAI``,
``AsyncAnthropic``), and there a tool function may be a coroutine function. Both drive one loop
(:func:`_steps`, a generator free of I/O), so they behave the same.

The client is used as given: nothing here opens a connection, and the calls are made on the
caller's thread (or task). The clients need not be the ``openai``/``anthropic`` packages' own; anything
with the same method and response shape works.
"""

from __future__ import annotations

import inspect
import json
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
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

__all__ = ["LoopResult", "arun_anthropic", "arun_openai", "run_anthropic", "run_openai"]

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


def _result_text(result: Any) -> str:
    return result if isinstance(result, str) else json.dumps(result, default=str)


class _Shape:
    """How one client family builds requests and reads responses."""

    provider: str

    def with_instruction(self, history: list[Any], text: str) -> list[Any]:
        raise NotImplementedError

    def parse(self, response: Any) -> tuple[str, list[_Call], Any, Any]:
        """(text, tool calls, the assistant message for the history, usage)."""
        raise NotImplementedError

    def usage(self, usage: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def add_results(self, history: list[Any], results: list[tuple[_Call, str]]) -> list[Any]:
        raise NotImplementedError


_Request = tuple[str, Any]
"""What the loop asks its driver for: ``("model", kwargs)`` or ``("tool", call)``."""


def _steps(
    run: RunControl,
    shape: _Shape,
    model: str,
    history: list[Any],
    tools: Sequence[Any],
    create: dict[str, Any],
) -> Generator[_Request, Any, LoopResult | StoppedRun]:
    """The loop itself, free of I/O: it yields what to do and is sent what came back.

    One loop for the sync and the async drivers: a model request is answered with the
    client's response; a tool call with ``(result, error)``.
    """
    try:
        while True:
            run.before_model()
            wrap = run.wrap_up()
            kwargs = dict(create)
            if wrap is None and tools:
                kwargs["tools"] = list(tools)
            sent = shape.with_instruction(history, wrap) if wrap else history
            response = yield ("model", {"model": model, "messages": sent, **kwargs})
            text, calls, assistant, usage = shape.parse(response)
            if not calls:
                run.note_answer(text)
            tokens_in, tokens_out = shape.usage(usage)
            run.after_model(
                model=_field(response, "model") or model,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                provider=shape.provider,
            )
            history = [*sent, assistant]
            if not calls:
                receipt = run.finish(text)
                return LoopResult(output=text, messages=tuple(history), receipt=receipt)
            results: list[tuple[_Call, str]] = []
            for call in calls:
                refusal = run.before_tool(call.name, call.arguments)
                if refusal is not None:  # not run: the model gets this text as the result
                    results.append((call, refusal))
                    continue
                result, error = yield ("tool", call)
                if error is not None:
                    run.after_tool(call.name, call.arguments, error=error)
                    results.append((call, f"Error: {type(error).__name__}: {error}"))
                else:
                    run.after_tool(call.name, call.arguments, result)
                    results.append((call, _result_text(result)))
            history = shape.add_results(history, results)
    except RunStopped as exc:
        return run.stop_result(exc)


def _tool_fn(functions: Mapping[str, Callable[..., Any]], call: _Call) -> Callable[[], Any]:
    fn = functions.get(call.name)
    if fn is None:
        raise LookupError(f"no function for tool {call.name!r}")
    if not isinstance(call.arguments, dict):
        raise TypeError("the arguments are not a JSON object")
    arguments = call.arguments
    return lambda: fn(**arguments)


def _drive(
    steps: Generator[_Request, Any, LoopResult | StoppedRun],
    create: Callable[..., Any],
    functions: Mapping[str, Callable[..., Any]],
) -> LoopResult | StoppedRun:
    try:
        kind, payload = next(steps)
        while True:
            if kind == "model":
                answer: Any = create(**payload)
            else:
                try:
                    answer = (_tool_fn(functions, payload)(), None)
                except RunStopped as exc:
                    kind, payload = steps.throw(exc)
                    continue
                except Exception as exc:
                    answer = (None, exc)
            kind, payload = steps.send(answer)
    except StopIteration as done:
        result: LoopResult | StoppedRun = done.value
        return result
    finally:
        steps.close()


async def _adrive(
    steps: Generator[_Request, Any, LoopResult | StoppedRun],
    create: Callable[..., Any],
    functions: Mapping[str, Callable[..., Any]],
) -> LoopResult | StoppedRun:
    try:
        kind, payload = next(steps)
        while True:
            if kind == "model":
                answer: Any = await create(**payload)
            else:
                try:
                    value = _tool_fn(functions, payload)()
                    if inspect.isawaitable(value):
                        value = await value
                    answer = (value, None)
                except RunStopped as exc:
                    kind, payload = steps.throw(exc)
                    continue
                except Exception as exc:
                    answer = (None, exc)
            kind, payload = steps.send(answer)
    except StopIteration as done:
        result: LoopResult | StoppedRun = done.value
        return result
    finally:
        steps.close()


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


class _OpenAI(_Shape):
    provider = "openai"

    def with_instruction(self, history: list[Any], text: str) -> list[Any]:
        return [*history, {"role": "user", "content": text}]

    def parse(self, response: Any) -> tuple[str, list[_Call], Any, Any]:
        message = _field(_field(response, "choices")[0], "message")
        if hasattr(message, "model_dump"):
            assistant = message.model_dump(exclude_none=True)
        else:
            assistant = dict(message)
        text = _field(message, "content") or ""
        return str(text), _openai_calls(message), assistant, _field(response, "usage")

    def usage(self, usage: Any) -> tuple[Any, Any]:
        return _field(usage, "prompt_tokens", 0), _field(usage, "completion_tokens", 0)

    def add_results(self, history: list[Any], results: list[tuple[_Call, str]]) -> list[Any]:
        return [
            *history,
            *({"role": "tool", "tool_call_id": c.id, "content": text} for c, text in results),
        ]


# -- Anthropic messages ------------------------------------------------------------------------


class _Anthropic(_Shape):
    provider = "anthropic"

    def with_instruction(self, history: list[Any], text: str) -> list[Any]:
        """``history`` with ``text`` added to the last user turn (Anthropic turns alternate)."""
        if history and _field(history[-1], "role") == "user":
            last = dict(history[-1])
            content = last.get("content")
            blocks = (
                [{"type": "text", "text": content}]
                if isinstance(content, str)
                else list(content or [])
            )
            last["content"] = [*blocks, {"type": "text", "text": text}]
            return [*history[:-1], last]
        return [*history, {"role": "user", "content": text}]

    def parse(self, response: Any) -> tuple[str, list[_Call], Any, Any]:
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
        assistant = {"role": "assistant", "content": blocks}
        return "".join(texts), calls, assistant, _field(response, "usage")

    def usage(self, usage: Any) -> tuple[Any, Any]:
        return _field(usage, "input_tokens", 0), _field(usage, "output_tokens", 0)

    def add_results(self, history: list[Any], results: list[tuple[_Call, str]]) -> list[Any]:
        blocks = [{"type": "tool_result", "tool_use_id": c.id, "content": t} for c, t in results]
        return [*history, {"role": "user", "content": blocks}]


# -- the entry points --------------------------------------------------------------------------


_UNSET: Any = object()
"""A Guard option the caller did not pass: the Guard's own default applies."""


def _guard_options(old: Mapping[str, Any] | None, **given: Any) -> dict[str, Any]:
    """The Guard options of one call: ``prices=``, ``ledger=``, ``clock=``, ``normalizer=``
    as keywords (as every other adapter takes them), over the deprecated ``guard_options``."""
    options: dict[str, Any] = {}
    if old is not None:
        warnings.warn(
            "guard_options= is deprecated: pass prices=, ledger=, clock= or normalizer= "
            "as keywords, as every other tripwire adapter takes them",
            DeprecationWarning,
            stacklevel=4,
        )
        if not isinstance(old, Mapping):
            raise ConfigError("guard_options", old, "a mapping of Guard options, or None")
        options.update(old)
    options.update((k, v) for k, v in given.items() if v is not _UNSET)
    return options


def _prepare(
    shape: _Shape, model: str, messages: Sequence[Any], tools: Sequence[Any],
    functions: Mapping[str, Callable[..., Any]], options: dict[str, Any], create: dict[str, Any],
) -> Generator[_Request, Any, LoopResult | StoppedRun]:  # fmt: skip
    guard_options = options.pop("guard_options")
    run = _start(functions, guard_options=guard_options, **options)
    return _steps(run, shape, model, list(messages), tools, create)


_DOC = """

    Args:
        client: the client (or anything with the same method and response shape).
        model, messages, tools: as for the client's ``create``; ``messages`` is copied.
        functions: tool name → the function that runs it (called with the arguments as
            keywords; in the ``a``-prefixed variants it may be a coroutine function).
        limits, loop_policy, on_loop, agent, on_receipt, partial_answer: as for
            :func:`~tripwire.integrations.new_run`.
        max_turns: the step limit when ``limits`` has none (a backstop, not a loop detector).
        prices, ledger, clock, normalizer: :class:`~tripwire.guard.Guard` options, as every
            adapter takes them (``prices=None``: no cost from the price table).
        guard_options: deprecated (a warning): the same options as one mapping.
        **create: further arguments for every ``create`` call (``temperature``…).

    Returns:
        A :class:`LoopResult` when the model answered, a
        :class:`~tripwire.integrations.StoppedRun` when tripwire ended the run.
"""


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
    prices: Any = _UNSET,
    ledger: Any = _UNSET,
    clock: Any = _UNSET,
    normalizer: Any = _UNSET,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    options = dict(limits=limits, loop_policy=loop_policy, on_loop=on_loop, agent=agent,
                   on_receipt=on_receipt, partial_answer=partial_answer, max_turns=max_turns,
                   guard_options=_guard_options(guard_options, prices=prices, ledger=ledger,
                                                clock=clock, normalizer=normalizer))  # fmt: skip
    steps = _prepare(_OpenAI(), model, messages, tools, functions, options, create)
    return _drive(steps, client.chat.completions.create, functions)


async def arun_openai(
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
    prices: Any = _UNSET,
    ledger: Any = _UNSET,
    clock: Any = _UNSET,
    normalizer: Any = _UNSET,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    options = dict(limits=limits, loop_policy=loop_policy, on_loop=on_loop, agent=agent,
                   on_receipt=on_receipt, partial_answer=partial_answer, max_turns=max_turns,
                   guard_options=_guard_options(guard_options, prices=prices, ledger=ledger,
                                                clock=clock, normalizer=normalizer))  # fmt: skip
    steps = _prepare(_OpenAI(), model, messages, tools, functions, options, create)
    return await _adrive(steps, client.chat.completions.create, functions)


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
    prices: Any = _UNSET,
    ledger: Any = _UNSET,
    clock: Any = _UNSET,
    normalizer: Any = _UNSET,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    options = dict(limits=limits, loop_policy=loop_policy, on_loop=on_loop, agent=agent,
                   on_receipt=on_receipt, partial_answer=partial_answer, max_turns=max_turns,
                   guard_options=_guard_options(guard_options, prices=prices, ledger=ledger,
                                                clock=clock, normalizer=normalizer))  # fmt: skip
    steps = _prepare(_Anthropic(), model, messages, tools, functions, options,
                     {"max_tokens": max_tokens, **create})  # fmt: skip
    return _drive(steps, client.messages.create, functions)


async def arun_anthropic(
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
    prices: Any = _UNSET,
    ledger: Any = _UNSET,
    clock: Any = _UNSET,
    normalizer: Any = _UNSET,
    guard_options: Mapping[str, Any] | None = None,
    **create: Any,
) -> LoopResult | StoppedRun:
    options = dict(limits=limits, loop_policy=loop_policy, on_loop=on_loop, agent=agent,
                   on_receipt=on_receipt, partial_answer=partial_answer, max_turns=max_turns,
                   guard_options=_guard_options(guard_options, prices=prices, ledger=ledger,
                                                clock=clock, normalizer=normalizer))  # fmt: skip
    steps = _prepare(_Anthropic(), model, messages, tools, functions, options,
                     {"max_tokens": max_tokens, **create})  # fmt: skip
    return await _adrive(steps, client.messages.create, functions)


run_openai.__doc__ = (
    "Run the tool loop on an OpenAI-shaped client (``client.chat.completions.create``)." + _DOC
)
arun_openai.__doc__ = (
    "The tool loop on an async OpenAI-shaped client (``openai.AsyncOpenAI()``)." + _DOC
)
run_anthropic.__doc__ = (
    "Run the tool loop on an Anthropic-shaped client (``client.messages.create``); "
    "``max_tokens`` goes to every call." + _DOC
)
arun_anthropic.__doc__ = (
    "The tool loop on an async Anthropic-shaped client (``anthropic.AsyncAnthropic()``)." + _DOC
)
