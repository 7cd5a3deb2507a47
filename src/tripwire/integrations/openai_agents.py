"""tripwire inside the OpenAI Agents SDK: one run of ``Runner.run`` under one Guard.

Two lines::

    from tripwire.integrations.openai_agents import Tripwire     # pip install 'tripwire[openai-agents]'

    result = await Tripwire(Limits(max_steps=20)).run(agent, "What is the refund policy?")
    # an agents RunResult when the run ended by itself, a StoppedRun when tripwire ended it

What it uses of the SDK, and why:

- **a tool input guardrail** on every function tool (the agent is cloned; yours is left as it
  is). The SDK runs it before the tool body, and it is the SDK's own way to refuse a call: the
  nudge and a restricted budget's refusal reach the model as the tool's output
  (``reject_content``); a stop raises the SDK's typed ``ToolInputGuardrailTripwireTriggered``.
  An exception raised *inside* a tool would not stop anything: the SDK turns it into "An error
  occurred while running the tool. Please try again." and the run goes on.
  The SDK runs the guardrails of one model response's calls before any of their bodies:
  identical calls take turns (the next is checked once the watcher has seen the result of the
  one before), so 4 identical calls of one response run 3 bodies, not 4.
- **RunHooks** (:class:`TripwireHooks`): ``on_llm_end`` reads the usage from the SDK's own
  ``ModelResponse`` (a custom ``Model`` class emits no model spans, so nothing else would count
  it); ``on_tool_end`` hands the result to the loop watcher; hook exceptions propagate.
- **RunConfig.call_model_input_filter** counts each step before the model call, and on the
  graceful last step (a budget nearly spent) adds the wrap-up instruction and switches tools
  off for that one call (``tool_choice="none"``); its answer is kept.
- **the SDK's ``max_turns``**, when you pass it to :meth:`Tripwire.run`, is the run's step
  budget too (unless ``Limits(max_steps=...)`` is smaller): the last turn is the graceful
  tool-less step, and its answer is the run's ``final_output``. Should the SDK's own cap still
  fire (a model that calls tools on the tool-less step), a ``max_turns`` error handler returns
  the latest answer instead of raising ``MaxTurnsExceeded``; the receipt says ``max_steps``.

To call ``Runner.run`` or ``Runner.run_streamed`` yourself, build the pieces from one
:class:`TripwireHooks`: ``hooks.guard_agent(agent)``, ``hooks=hooks``,
``run_config=hooks.run_config(...)``, ``error_handlers=hooks.error_handlers(...)``; a stop then
reaches you as the SDK's exception, and :func:`stopped_run_from` finds the tripwire stop in it.

Every run hands its receipt to ``on_receipt``. Tools the SDK runs without a guardrail (hosted,
computer and shell tools) are checked in ``on_tool_start``: there a stop still stops the run,
but a nudge or a refusal cannot be handed to the model, so the call runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tripwire.core.reasons import StopReason
from tripwire.errors import RunStopped
from tripwire.integrations._common import (
    CallTurns,
    RunControl,
    RunSettings,
    StoppedRun,
)

try:
    from agents import (
        Agent,
        FunctionTool,
        ItemHelpers,
        ModelSettings,
        RunConfig,
        RunHooks,
        Runner,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
    )
    from agents.exceptions import ToolInputGuardrailTripwireTriggered, UserError
    from agents.items import ModelResponse
    from agents.result import RunResult
    from agents.run_config import CallModelData, ModelInputData
    from agents.run_error_handlers import RunErrorHandlerInput, RunErrorHandlerResult
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tripwire.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'tripwire[openai-agents]'"
    ) from exc

__all__ = ["Tripwire", "TripwireHooks", "stopped_run_from"]

logger = logging.getLogger("tripwire.integrations.openai_agents")

_GUARDRAIL_NAME = "tripwire"


def stopped_run_from(exc: BaseException) -> RunStopped | None:
    """The tripwire stop behind an exception the SDK raised, or ``None``.

    The SDK raises a hook's exception as is from model hooks, wraps it in ``UserError`` (the
    stop as ``__cause__``) from tool hooks, and raises ``ToolInputGuardrailTripwireTriggered``
    (the stop as ``output.output_info``) from tripwire's guardrail.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RunStopped):
            return current
        if isinstance(current, ToolInputGuardrailTripwireTriggered):
            info = current.output.output_info
            if isinstance(info, RunStopped):
                return info
        current = current.__cause__ or current.__context__
    return None


def _model_name(agent: Any) -> str | None:
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


def _free_choice(*settings: ModelSettings | None) -> bool:
    """No tool choice is forced (``"required"`` or a tool name) by any of ``settings``."""
    return all(s is None or s.tool_choice in (None, "auto") for s in settings)


class TripwireHooks(RunHooks[Any]):
    """The SDK's ``RunHooks`` for one run under one :class:`~tripwire.integrations.RunControl`.

    Hook exceptions propagate in the SDK (model hooks as they are, tool hooks wrapped in
    ``UserError``), so a stop raised here ends the run. Use :meth:`Tripwire.run`, which also
    installs the guardrail, the step filter and the ``max_turns`` handler; build this yourself
    only to pass it to ``Runner.run`` with :meth:`run_config` and :meth:`error_handlers`.

    Args:
        control: the run.
        hooks: your own ``RunHooks``, called after tripwire's for every event.
    """

    control: RunControl
    """The run these hooks report to."""

    def __init__(self, control: RunControl, *, hooks: RunHooks[Any] | None = None) -> None:
        self.control = control
        self._inner = hooks
        self._counted = False
        self._answer: str | None = None
        self._checked: set[str] = set()
        self._turns = CallTurns()
        self._held: dict[str, str] = {}  # tool call id -> its turn, until its result is seen
        self._user_filter: Callable[[CallModelData[Any]], Any] | None = None
        self._settings: ModelSettings | None = None
        self._config: RunConfig | None = None
        self.guardrail: ToolInputGuardrail[Any] = ToolInputGuardrail(
            guardrail_function=self._check_tool, name=_GUARDRAIL_NAME
        )
        """The tool input guardrail that checks each function tool call before it runs."""

    # -- what Runner.run needs --------------------------------------------------------------

    def run_config(self, base: RunConfig | None = None) -> RunConfig:
        """A copy of ``base`` whose model input filter counts steps and applies the wrap-up."""
        base = base if base is not None else RunConfig()
        self._user_filter = base.call_model_input_filter
        self._settings = base.model_settings
        self._config = dataclasses.replace(base, call_model_input_filter=self._filter_input)
        return self._config

    def error_handlers(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``base`` plus a ``max_turns`` handler that returns the partial answer (yours wins)."""
        handlers: dict[str, Any] = dict(base or {})
        handlers.setdefault("max_turns", self._max_turns)
        return handlers

    def guard_agent(self, agent: Agent[Any]) -> Agent[Any]:
        """A clone of ``agent`` (and of the agents it hands off to) whose function tools carry
        the guardrail. The originals are not changed."""
        clones: dict[int, Agent[Any]] = {}
        return self._clone(agent, clones)

    def _clone(self, agent: Agent[Any], clones: dict[int, Agent[Any]]) -> Agent[Any]:
        done = clones.get(id(agent))
        if done is not None:
            return done
        tools = [self._guard_tool(t) for t in agent.tools]
        options: dict[str, Any] = {}
        if agent.reset_tool_choice and _free_choice(agent.model_settings, self._settings):
            # The SDK resets tool_choice to None after a tool call when reset_tool_choice is
            # on, which would undo the last step's tool_choice="none". With no forced choice
            # there is nothing for the reset to undo but ours.
            options["reset_tool_choice"] = False
        clone = agent.clone(tools=tools, handoffs=[], **options)
        clones[id(agent)] = clone
        clone.handoffs = [
            self._clone(h, clones) if isinstance(h, Agent) else h for h in agent.handoffs
        ]
        return clone

    def _guard_tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool
        # A tool cloned for an earlier run carries that run's guardrail: replace it.
        guardrails = [
            g for g in tool.tool_input_guardrails or [] if g.get_name() != _GUARDRAIL_NAME
        ]
        return dataclasses.replace(tool, tool_input_guardrails=[*guardrails, self.guardrail])

    # -- steps ------------------------------------------------------------------------------

    async def _filter_input(self, data: CallModelData[Any]) -> ModelInputData:
        model_data = data.model_data
        if self._user_filter is not None:
            updated = self._user_filter(data)
            model_data = await updated if inspect.isawaitable(updated) else updated
        self.control.before_model()  # may raise RunStopped: the SDK re-raises it as is
        self._counted = True
        wrap = self.control.wrap_up()
        config = self._config
        if config is not None:
            # Model settings are resolved after this filter, from the run config: the one
            # tool-less call gets tool_choice="none", the others the caller's own settings.
            settings = self._settings
            if wrap is not None:
                settings = (settings or ModelSettings()).resolve(ModelSettings(tool_choice="none"))
            config.model_settings = settings
        if wrap is not None:
            instructions = model_data.instructions
            model_data = ModelInputData(
                input=model_data.input,
                instructions=f"{instructions}\n\n{wrap}" if instructions else wrap,
            )
        return model_data

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: str | None, input_items: list[Any]
    ) -> None:
        if self._counted:
            self._counted = False
        else:  # the hooks were passed without run_config(): count the step here
            self.control.before_model()
        if self._inner is not None:
            await self._inner.on_llm_start(context, agent, system_prompt, input_items)

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        usage = response.usage
        text: str | None = None
        for item in response.output:
            found = ItemHelpers.extract_last_text(item)
            if found:
                text = found
        if text is not None:
            self._answer = text
            self.control.note_answer(text)
        self.control.after_model(
            model=_model_name(agent),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )
        if self._inner is not None:
            await self._inner.on_llm_end(context, agent, response)

    # -- tools ------------------------------------------------------------------------------

    async def _check_tool(self, data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        context = data.context
        stopped = self.control.stopped
        if stopped is not None:  # a sibling in the batch of the call that stopped the run
            return ToolGuardrailFunctionOutput.raise_exception(output_info=stopped)
        # The SDK checks every call of a batch before any body runs: identical calls take
        # turns, so the watcher has seen the 3rd's result when it judges the 4th. The turn
        # is given back in on_tool_end, once the watcher has seen this call's result.
        key = await self._turns.take(self.control, context.tool_name, context.tool_arguments)
        held = False
        try:
            stopped = self.control.stopped
            if stopped is not None:  # the call before this one stopped the run
                return ToolGuardrailFunctionOutput.raise_exception(output_info=stopped)
            try:
                refusal = self.control.before_tool(context.tool_name, context.tool_arguments)
            except RunStopped as exc:
                return ToolGuardrailFunctionOutput.raise_exception(output_info=exc)
            if refusal is not None:
                return ToolGuardrailFunctionOutput.reject_content(refusal)
            self._checked.add(context.tool_call_id)
            self._held[context.tool_call_id] = key
            held = True
            return ToolGuardrailFunctionOutput.allow()
        finally:
            if not held:
                self._turns.give_back(key)

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        call_id = getattr(context, "tool_call_id", None)
        if call_id in self._checked:
            self._checked.discard(call_id)
        else:  # a tool the guardrail does not cover: a stop still stops the run here
            stopped = self.control.stopped
            if stopped is not None:
                raise stopped
            refusal = self.control.before_tool(tool.name, getattr(context, "tool_arguments", None))
            if refusal is not None:
                logger.warning(
                    "tripwire refused a %s call, but the SDK runs that kind of tool without a "
                    "guardrail, so the refusal cannot reach the model: the call runs",
                    tool.name,
                )
        if self._inner is not None:
            await self._inner.on_tool_start(context, agent, tool)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        call_id = getattr(context, "tool_call_id", None)
        key = self._held.pop(call_id, None) if isinstance(call_id, str) else None
        try:
            self.control.after_tool(tool.name, getattr(context, "tool_arguments", None), result)
        finally:
            if key is not None:
                self._turns.give_back(key)
        if self._inner is not None:
            await self._inner.on_tool_end(context, agent, tool, result)

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        if self._inner is not None:
            await self._inner.on_agent_start(context, agent)

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        if self._inner is not None:
            await self._inner.on_agent_end(context, agent, output)

    async def on_handoff(self, context: Any, from_agent: Any, to_agent: Any) -> None:
        if self._inner is not None:
            await self._inner.on_handoff(context, from_agent, to_agent)

    # -- the SDK's own step cap -------------------------------------------------------------

    def _max_turns(self, data: RunErrorHandlerInput[Any]) -> RunErrorHandlerResult:
        self.control.guard.finish(StopReason.MAX_STEPS)
        return RunErrorHandlerResult(final_output=self._answer or "")


class Tripwire(RunSettings):
    """Runs OpenAI Agents SDK agents under tripwire: one fresh Guard per :meth:`run`.

    Args:
        limits: each run's budgets (default none: only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (the kill switch, default) or ``"nudge"`` (one message first).
        agent: the agent's name on receipts (default the SDK agent's ``name``).
        on_receipt: called once with each run's receipt (e.g. a store's ``save``).
        partial_answer: builds a partial answer from the run state when tripwire stops a run.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``,
            ``prices``, ``clock``, ``normalizer``).

    Raises:
        ConfigError: a setting is invalid (names the field).
    """

    async def run(
        self,
        agent: Agent[Any],
        input: Any,
        *,
        run_config: RunConfig | None = None,
        hooks: RunHooks[Any] | None = None,
        error_handlers: Mapping[str, Any] | None = None,
        **runner_options: Any,
    ) -> RunResult | StoppedRun:
        """``Runner.run(agent, input, ...)`` under a fresh guard.

        Unless you pass ``max_turns``, the SDK's own flat turn cap is off: tripwire's limits
        (``Limits(max_steps=...)``) and loop watcher decide when the run stops. A ``max_turns``
        you pass is the run's step budget too (unless the limits set a smaller one): its last
        turn is the graceful tool-less step, whose answer is the ``final_output``.

        Returns:
            The SDK's ``RunResult`` when the run ended by itself (or the SDK's ``max_turns``
            handler ended it), a :class:`~tripwire.integrations.StoppedRun` when tripwire
            stopped it. Other exceptions of the run propagate as they are.
        """
        # The SDK's max_turns, when the caller sets one, is the run's step budget too: the
        # last turn is the graceful tool-less step and its answer is the run's final output
        # (the SDK's own cap would end the run with final_output == "").
        max_turns = runner_options.get("max_turns")
        cap = max_turns if isinstance(max_turns, int) and not isinstance(max_turns, bool) else None
        control = self.new_run(agent.name or "agent", max_steps=cap if cap and cap > 0 else None)
        tw = TripwireHooks(control, hooks=hooks)
        config = tw.run_config(run_config)
        # The SDK's flat max_turns (10 by default) would cut a healthy deep run short: unless
        # the caller sets it, tripwire's own limits and loop watcher decide when to stop.
        runner_options.setdefault("max_turns", None)
        with control.activate():
            try:
                result = await Runner.run(
                    tw.guard_agent(agent),
                    input,
                    hooks=tw,
                    run_config=config,
                    error_handlers=tw.error_handlers(error_handlers),  # type: ignore[arg-type]
                    **runner_options,
                )
            except (RunStopped, UserError, ToolInputGuardrailTripwireTriggered) as exc:
                stop = stopped_run_from(exc)
                if stop is None:
                    control.failed(exc)
                    raise
                return control.stop_result(stop)
            except BaseException as exc:
                control.failed(exc)
                raise
        control.finish(result.final_output)
        return result

    def run_sync(self, agent: Agent[Any], input: Any, **options: Any) -> RunResult | StoppedRun:
        """:meth:`run` from synchronous code (not inside a running event loop)."""
        return asyncio.run(self.run(agent, input, **options))
