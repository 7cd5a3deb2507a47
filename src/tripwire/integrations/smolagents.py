"""tripwire inside smolagents: ``step_callbacks`` plus a tool wrapper, one Guard per run.

Two lines::

    from tripwire.integrations.smolagents import Tripwire    # pip install 'tripwire[smolagents]'

    answer = Tripwire(Limits(max_steps=20)).run(agent, "What is the refund policy?")
    # the agent's answer when the run ended by itself, a StoppedRun when tripwire ended it

What it uses of smolagents, and why:

- **a tool wrapper** around each of the agent's tools (``final_answer`` excepted: an answer is
  never refused by a tool-call cap). It checks each call before the tool body runs: the nudge
  and a restricted budget's refusal come back as the tool's result, which smolagents shows the
  model as the observation. A stop cannot end the run from inside a tool, since smolagents turns
  a tool's exception into an error observation and asks the model again; so the wrapper refuses
  the call (the body does not run, the observation says why) and the step callback ends the
  run.
- **the agent's model, metered**: each model call's usage (smolagents' own ``token_usage``; a
  custom ``Model`` emits no model spans) is recorded the moment the call returns, before the
  step's tools run, so a step whose tool call is refused still counts its tokens, and a token
  or cost budget crossed by a call refuses the tools that call asked for. The agent's
  ``model`` is a thin wrapper that answers to the wrapped model's class.
- **step_callbacks**, which run at the end of every step and whose exceptions propagate out of
  ``agent.run``: the callback raises the stop and counts the *next* step before its model
  call is made, so a step budget refuses it in time. On the graceful last step the
  callback adds the wrap-up instruction to the step's observations and leaves the model only
  ``final_answer`` for one call; that answer is kept. When smolagents' own ``max_steps`` ends the
  run, the receipt says ``max_steps``.

Works with ``ToolCallingAgent`` and ``CodeAgent`` (the code executor calls the wrapped tools).
:meth:`Tripwire.attach` changes the agent in place (its tools, model and callbacks); one run at a time
per agent instance, as smolagents itself requires. Every run hands its receipt to
``on_receipt``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from tripwire.core.budget import NO_LIMITS, Limits
from tripwire.core.reasons import StopReason
from tripwire.errors import ConfigError, RunStopped
from tripwire.integrations._common import (
    RunControl,
    RunSettings,
    StoppedRun,
)

try:
    from smolagents import Tool  # type: ignore[import-untyped]
    from smolagents.memory import (  # type: ignore[import-untyped]
        ActionStep,
        FinalAnswerStep,
        PlanningStep,
    )
    from smolagents.utils import AgentMaxStepsError  # type: ignore[import-untyped]
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tripwire.integrations.smolagents needs smolagents: pip install 'tripwire[smolagents]'"
    ) from exc

__all__ = ["GuardedTool", "Tripwire"]

_FINAL_ANSWER = "final_answer"


class _AgentRuns:
    """The run in progress of one agent instance (smolagents runs one at a time per agent)."""

    def __init__(self, owner: Tripwire, agent: Any) -> None:
        self._owner = owner
        self._agent = agent
        self._lock = threading.Lock()
        self._control: RunControl | None = None
        self.last: RunControl | None = None
        """The latest run that ended (for :meth:`Tripwire.stopped_run`)."""
        self._saved_tools: dict[str, Any] | None = None

    def current(self) -> RunControl:
        """This agent's run, started (and its first step counted) at its first event."""
        with self._lock:
            control = self._control
            if control is None:
                name = getattr(self._agent, "name", None) or type(self._agent).__name__
                control = self._control = self._owner.new_run(name)
                fresh = True
            else:
                fresh = False
        if fresh:
            # smolagents shows nothing before the first model call: count it at the first event.
            self.before_model(control)
        return control

    def started(self) -> RunControl:
        """Start a run now (from :meth:`Tripwire.run`), before the first model call."""
        with self._lock:
            self._control = None
        return self.current()

    def end(self) -> None:
        """The run is over: forget it and give the agent its tools back."""
        with self._lock:
            if self._control is not None:
                self.last = self._control
            self._control = None
            saved, self._saved_tools = self._saved_tools, None
        if saved is not None:
            self._agent.tools = saved

    def before_model(self, control: RunControl) -> None:
        control.before_model()
        if control.wrap_up() is not None:
            self._only_final_answer()

    def _only_final_answer(self) -> None:
        tools = self._agent.tools
        if self._saved_tools is None and _FINAL_ANSWER in tools:
            self._saved_tools = dict(tools)
            self._agent.tools = {_FINAL_ANSWER: tools[_FINAL_ANSWER]}

    def on_step(self, step: Any, agent: Any = None) -> None:
        """The step callback (registered for action, planning and final-answer steps)."""
        if isinstance(step, FinalAnswerStep):
            control = self.current()
            self.end()
            control.finish(step.output)
            return
        control = self.current()
        try:
            self._after_step(control, step)
        except RunStopped:
            self.end()
            raise

    def _after_step(self, control: RunControl, step: Any) -> None:
        stopped = control.stopped
        if stopped is not None:  # refused inside a tool: smolagents made it an observation
            raise stopped
        # The step's usage was recorded when its model call returned (_MeteredModel).
        if isinstance(step, PlanningStep):
            return
        if step.is_final_answer:
            control.note_answer(step.action_output)
            return
        if isinstance(step.error, AgentMaxStepsError):
            # smolagents' own max_steps: its tool-less final answer was the last model call.
            control.guard.finish(StopReason.MAX_STEPS)
            control.note_answer(step.action_output)
            return
        self.before_model(control)  # the next step, before its model call
        wrap = control.wrap_up()
        if wrap is not None:
            step.observations = f"{step.observations}\n{wrap}" if step.observations else wrap


class _MeteredModel:
    """The agent's model, with each call's usage recorded the moment the call returns.

    smolagents runs a step's tools before its step callback: had the usage waited for the
    callback, a stop raised by one of those tools would have come first, and the model call
    that asked for the refused tool would have been left out of the receipt. Everything but
    ``generate`` and ``generate_stream`` is the wrapped model's own (its class included, for
    ``isinstance`` and ``agent.to_dict``). A stop the usage raises (a token or cost budget) is
    kept on the run, not raised into smolagents (which would make it a generation error): the
    step's tools are refused and the step callback ends the run.
    """

    def __init__(self, model: Any, runs: _AgentRuns) -> None:
        object.__setattr__(self, "_tw_model", model)
        object.__setattr__(self, "_tw_runs", runs)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # the wrapped model's class
        return type(self._tw_model)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tw_model, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._tw_model, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.generate(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        message = self._tw_model.generate(*args, **kwargs)
        usage = getattr(message, "token_usage", None)
        if usage is not None:
            self._record(usage.input_tokens, usage.output_tokens)
        return message

    def generate_stream(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        input_tokens = output_tokens = 0
        seen = False
        for event in self._tw_model.generate_stream(*args, **kwargs):
            usage = getattr(event, "token_usage", None)
            if usage is not None:  # as smolagents adds it up: the last input, every output
                seen = True
                input_tokens = usage.input_tokens
                output_tokens += usage.output_tokens
            yield event
        if seen:
            self._record(input_tokens, output_tokens)

    def _record(self, input_tokens: Any, output_tokens: Any) -> None:
        control = self._tw_runs.current()
        with contextlib.suppress(RunStopped):  # kept on the run; see the class docstring
            control.after_model(
                model=getattr(self._tw_model, "model_id", None),
                input_tokens=input_tokens,
                output_tokens=output_tokens,
            )


class GuardedTool(Tool):  # type: ignore[misc]
    """A smolagents ``Tool`` that asks tripwire before running the tool it wraps.

    Same name, description, inputs and output type as the wrapped tool, so the model sees no
    difference. A refused call returns the refusal text instead of running.
    """

    skip_forward_signature_validation = True

    def __init__(self, tool: Any, runs: _AgentRuns) -> None:
        self.name = tool.name
        self.description = tool.description
        self.inputs = tool.inputs
        self.output_type = tool.output_type
        self.output_schema = getattr(tool, "output_schema", None)
        self.wrapped = tool
        """The tool that runs when tripwire allows the call."""
        self._runs = runs
        super().__init__()
        self.is_initialized = True  # the wrapped tool sets itself up on its first call

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    def __call__(self, *args: Any, sanitize_inputs_outputs: bool = False, **kwargs: Any) -> Any:
        if kwargs:
            arguments: Any = kwargs
        elif len(args) == 1:
            arguments = args[0]
        else:
            arguments = list(args)
        control = self._runs.current()
        stopped = control.stopped
        if stopped is not None:  # a sibling in the batch of the call that stopped the run
            return f"Tool call refused: {stopped}"
        try:
            refusal = control.before_tool(self.name, arguments)
        except RunStopped as exc:
            # Raising here would only become an error observation (logged by smolagents with
            # the raw arguments): refuse the call, and the step callback ends the run.
            return f"Tool call refused: {exc}"
        if refusal is not None:
            return refusal
        try:
            result = self.wrapped(*args, sanitize_inputs_outputs=sanitize_inputs_outputs, **kwargs)
        except Exception as exc:
            with contextlib.suppress(RunStopped):  # kept on the run: the step callback raises it
                control.after_tool(self.name, arguments, error=exc)
            raise
        try:
            control.after_tool(self.name, arguments, result)
        except RunStopped as exc:
            return f"Run stopped: {exc}"  # the step callback ends the run
        return result


class Tripwire(RunSettings):
    """Puts smolagents agents under tripwire: one fresh Guard per run of each agent.

    Args:
        limits: each run's budgets (default none: only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (the kill switch, default) or ``"nudge"`` (one message first).
        agent: the agent's name on receipts (default the smolagents agent's ``name``).
        on_receipt: called once with each run's receipt (e.g. a store's ``save``).
        partial_answer: builds a partial answer from the run state when tripwire stops a run.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``,
            ``prices``, ``clock``, ``normalizer``).

    Raises:
        ConfigError: a setting is invalid (names the field).
    """

    def __init__(self, limits: Limits = NO_LIMITS, **settings: Any) -> None:
        super().__init__(limits, **settings)
        self._lock = threading.Lock()
        self._agents: dict[int, _AgentRuns] = {}

    def attach(self, agent: Any) -> Any:
        """Put ``agent`` under tripwire, in place: wrap its tools and its model, register the
        step callback.

        Returns the agent. Attaching it again changes nothing.
        """
        with self._lock:
            if id(agent) in self._agents:
                return agent
            runs = self._agents[id(agent)] = _AgentRuns(self, agent)
        tools: Mapping[str, Any] = agent.tools
        agent.tools = {
            name: tool if name == _FINAL_ANSWER or isinstance(tool, GuardedTool)
            else GuardedTool(tool, runs)
            for name, tool in tools.items()
        }  # fmt: skip
        if not isinstance(vars(agent).get("model"), _MeteredModel):
            agent.model = _MeteredModel(agent.model, runs)
        for step_cls in (ActionStep, PlanningStep, FinalAnswerStep):
            agent.step_callbacks.register(step_cls, runs.on_step)
        return agent

    def run(self, agent: Any, task: str, **run_options: Any) -> Any:
        """``agent.run(task, ...)`` under a fresh guard (attaching the agent first).

        Returns:
            What ``agent.run`` returns when the run ended by itself (or at smolagents' own
            ``max_steps``), a :class:`~tripwire.integrations.StoppedRun` when tripwire stopped
            it. Other exceptions of the run propagate as they are.
        """
        if run_options.get("stream"):
            raise ConfigError("stream", True, "False: iterate agent.run(stream=True) yourself")
        self.attach(agent)
        runs = self._agents[id(agent)]
        control = runs.started()
        try:
            with control.activate():
                return agent.run(task, **run_options)
        except RunStopped as exc:
            return control.stop_result(exc)
        except BaseException as exc:
            runs.end()
            control.failed(exc)
            raise

    def stopped_run(self, agent: Any, exc: RunStopped) -> StoppedRun:
        """The structured result for a stop raised out of ``agent.run`` (after :meth:`attach`)."""
        runs = self._agents.get(id(agent))
        if runs is None or runs.last is None:
            raise ConfigError("agent", agent, "an agent attached to this Tripwire that ran")
        return runs.last.stop_result(exc)
