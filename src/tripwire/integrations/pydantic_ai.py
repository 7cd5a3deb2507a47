"""tripwire inside pydantic-ai: one capability on the agent.

::

    from pydantic_ai import Agent
    from tripwire import Limits
    from tripwire.integrations import StoppedRun
    from tripwire.integrations.pydantic_ai import Tripwire

    agent = Agent(model, capabilities=[Tripwire(Limits(max_steps=20))])
    result = agent.run_sync("What is the refund policy?")
    if isinstance(result.output, StoppedRun):      # tripwire ended the run
        print(result.output.reason, result.output.partial)

How it hooks in (pydantic-ai's capability hooks):

- ``before_model_request``: counts the step, or stops the run. On the graceful last step
  (a step, token, cost or time budget nearly spent) the request goes out without tools and
  with the wrap-up instruction.
- ``after_model_request``: records the response's own usage (no model spans needed).
- ``wrap_tool_execute``: refuses the call *before its body runs* when it would be the 4th
  identical one (or hands the nudge text back as the tool's result, in nudge mode), then
  feeds the result to the loop watcher.
- ``wrap_run``: a stop raised in any hook ends the run there, and the run's result carries a
  :class:`~tripwire.integrations.StoppedRun` as its ``output`` (pass ``raise_on_stop=True``
  to get the :class:`~tripwire.errors.RunStopped` raised instead, with the receipt on it).

``UsageLimits`` bridge: the limits of a run's ``usage_limits`` (``request_limit``,
``tool_calls_limit``, token limits, ``cost_limit``) that the :class:`~tripwire.core.budget.Limits`
given here leave unset become tripwire limits for that run, so they end with the graceful last
step and a receipt instead of ``UsageLimitExceeded``. pydantic-ai's own checks stay in force as
a backstop.

Each run gets its own guard (``for_run``): two runs of one agent, in threads or asyncio
tasks, are judged separately.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tripwire.core.budget import NO_LIMITS, Limits
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.errors import ConfigError, RunStopped
from tripwire.integrations._common import (
    CallTurns,
    OnLoop,
    PartialAnswer,
    ReceiptSink,
    RunControl,
    current_run,
    new_run,
)

try:
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability
    from pydantic_ai.messages import (
        ModelRequest,
        ModelResponse,
        TextPart,
        ToolCallPart,
        UserPromptPart,
    )
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.usage import UsageLimits
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "tripwire.integrations.pydantic_ai needs pydantic-ai: pip install 'tripwire[pydantic-ai]'"
    ) from exc

__all__ = ["Tripwire", "limits_from_usage"]

_BRIDGE: tuple[tuple[str, str], ...] = (
    ("request_limit", "max_steps"),
    ("tool_calls_limit", "max_tool_calls"),
    ("input_tokens_limit", "max_input_tokens"),
    ("output_tokens_limit", "max_output_tokens"),
    ("total_tokens_limit", "max_total_tokens"),
    ("cost_limit", "max_cost_usd"),
)
"""pydantic-ai ``UsageLimits`` field → tripwire ``Limits`` field."""


def limits_from_usage(limits: Limits, usage_limits: UsageLimits | None) -> Limits:
    """``limits`` with each field it leaves unset taken from pydantic-ai's ``usage_limits``."""
    if usage_limits is None:
        return limits
    changes: dict[str, Any] = {}
    for theirs, ours in _BRIDGE:
        value = getattr(usage_limits, theirs, None)
        if value is not None and getattr(limits, ours) is None:
            changes[ours] = value
    return dataclasses.replace(limits, **changes) if changes else limits


def _text_of(response: ModelResponse) -> str | None:
    texts = [p.content for p in response.parts if isinstance(p, TextPart)]
    return "".join(texts) if texts else None


class Tripwire(AbstractCapability[Any]):
    """The pydantic-ai capability: loop detection, budgets and a receipt for every run.

    Args:
        limits: the run's budgets; unset fields are taken from the run's ``UsageLimits``.
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (default, the kill switch) or ``"nudge"``.
        agent: the name on receipts (default: the pydantic-ai agent's ``name``, else
            ``"agent"``).
        on_receipt: called once per run with its receipt (e.g. a store's ``save``).
        partial_answer: builds a partial answer from the run state when tripwire stops it.
        raise_on_stop: raise the :class:`~tripwire.errors.RunStopped` (receipt attached)
            instead of returning a :class:`~tripwire.integrations.StoppedRun` as the output.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``, ``prices``).
    """

    def __init__(
        self,
        limits: Limits = NO_LIMITS,
        *,
        loop_policy: LoopPolicy | None = DEFAULT_POLICY,
        on_loop: OnLoop | str = OnLoop.STOP,
        agent: str | None = None,
        on_receipt: ReceiptSink | None = None,
        partial_answer: PartialAnswer | None = None,
        raise_on_stop: bool = False,
        **guard_options: Any,
    ) -> None:
        if not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a tripwire Limits")
        try:
            OnLoop(on_loop)
        except ValueError:
            raise ConfigError("on_loop", on_loop, "'stop' or 'nudge'") from None
        self.limits = limits
        self.loop_policy = loop_policy
        self.on_loop = OnLoop(on_loop)
        self.agent = agent
        self.on_receipt = on_receipt
        self.partial_answer = partial_answer
        self.raise_on_stop = raise_on_stop
        self.guard_options = guard_options
        self.run: RunControl | None = None
        """This run's control (set on the per-run copy that ``for_run`` returns)."""
        self._turns = CallTurns()

    def _start(self, ctx: RunContext[Any]) -> RunControl:
        name = self.agent or getattr(ctx.agent, "name", None) or "agent"
        return new_run(
            limits_from_usage(self.limits, ctx.usage_limits),
            loop_policy=self.loop_policy,
            on_loop=self.on_loop,
            agent=name,
            on_receipt=self.on_receipt,
            partial_answer=self.partial_answer,
            **self.guard_options,
        )

    async def for_run(self, ctx: RunContext[Any]) -> Tripwire:
        """A fresh copy with its own guard: every run is judged on its own."""
        copy = Tripwire(
            self.limits,
            loop_policy=self.loop_policy,
            on_loop=self.on_loop,
            agent=self.agent,
            on_receipt=self.on_receipt,
            partial_answer=self.partial_answer,
            raise_on_stop=self.raise_on_stop,
            **self.guard_options,
        )
        copy.run = self._start(ctx)
        return copy

    def _control(self, ctx: RunContext[Any]) -> RunControl:
        if self.run is None:  # the hooks of an instance pydantic-ai did not copy for the run
            self.run = self._start(ctx)
        return self.run

    # -- the run ----------------------------------------------------------------------------

    async def wrap_run(self, ctx: RunContext[Any], *, handler: Callable[..., Any]) -> Any:
        run = self._control(ctx)
        token = current_run.set(run)
        try:
            result = await handler()
        except RunStopped as exc:
            stopped = run.stop_result(exc)
            if self.raise_on_stop:
                if exc.receipt is None:
                    exc.receipt = stopped.receipt
                raise
            return AgentRunResult(stopped)
        except BaseException as exc:
            run.failed(exc)  # a receipt that never claims "completed"; the error goes on
            raise
        finally:
            current_run.reset(token)
        run.finish(getattr(result, "output", None))
        return result

    # -- model requests ---------------------------------------------------------------------

    async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
        run = self._control(ctx)
        run.before_model()
        wrap = run.wrap_up()
        if wrap is None:
            return request_context
        # The graceful last step: no tools, and the wrap-up instruction as the last message.
        params = dataclasses.replace(request_context.model_request_parameters, function_tools=[])
        messages = [*request_context.messages, ModelRequest(parts=[UserPromptPart(wrap)])]
        return dataclasses.replace(
            request_context, model_request_parameters=params, messages=messages
        )

    async def after_model_request(
        self, ctx: RunContext[Any], *, request_context: Any, response: ModelResponse
    ) -> ModelResponse:
        run = self._control(ctx)
        usage = response.usage
        text = _text_of(response)
        if text is not None and not any(isinstance(p, ToolCallPart) for p in response.parts):
            run.note_answer(text)
        run.after_model(
            model=response.model_name,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            provider=response.provider_name,
        )
        return response

    # -- tool calls -------------------------------------------------------------------------

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: Any,
        args: Any,
        handler: Callable[..., Any],
    ) -> Any:
        run = self._control(ctx)
        arguments = call.args_as_dict()
        # pydantic-ai runs a batch of tool calls concurrently. Identical calls of one batch
        # take turns, so that the watcher has seen the one before when it judges the next
        # (a 4th identical call is refused, not run beside the 3rd); different calls still
        # run side by side.
        async with self._turns.turn(run, call.tool_name, arguments):
            return await self._execute(run, call, arguments, args, handler)

    async def _execute(
        self,
        run: RunControl,
        call: ToolCallPart,
        arguments: dict[str, Any],
        args: Any,
        handler: Callable[..., Any],
    ) -> Any:
        if run.stopped is not None:  # a sibling in the batch of the call that stopped the run
            raise run.stopped
        refusal = run.before_tool(call.tool_name, arguments)
        if refusal is not None:
            return refusal  # not run: the model gets this text as the tool's result
        try:
            result = await handler(args)
        except RunStopped:
            raise
        except Exception as exc:
            run.after_tool(call.tool_name, arguments, error=exc)
            raise
        run.after_tool(call.tool_name, arguments, result)
        return result
