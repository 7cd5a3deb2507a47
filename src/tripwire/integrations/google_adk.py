"""tripwire inside Google ADK: a plugin on the Runner, one Guard per invocation.

Two lines::

    from tripwire.integrations.google_adk import TripwirePlugin   # pip install 'tripwire[google-adk]'

    runner = Runner(agent=agent, app_name="support", session_service=sessions,
                    plugins=[TripwirePlugin(Limits(max_steps=20))])

Each invocation (one ``runner.run_async(...)``) is one run, keyed by its invocation id, so
concurrent invocations are judged separately. What the plugin uses of ADK, and why:

- **before/after tool callbacks**: ``before_tool_callback`` checks each call before the tool
  runs; returning a dict is ADK's own way to skip the tool and hand the model that dict as
  its result (the nudge, a restricted budget's refusal). A stop returns ``{"error": ...}``
  and sets ``skip_summarization``, which makes that tool response the invocation's final
  event: no model call follows.
- **before/after model callbacks**: ``before_model_callback`` counts each step before the model
  call; a stop short-circuits the call with an ``LlmResponse`` whose ``error_code`` is
  ``TRIPWIRE_STOPPED`` (ADK ends the invocation on it); on the graceful last step it removes
  the tools from the request and adds the wrap-up instruction. ``after_model_callback`` reads
  the usage from ADK's own ``usage_metadata``.
- The plugin never raises: ADK's plugin manager would wrap the exception in ``RuntimeError``
  and log it as a plugin failure.

A stop reaches the caller as that final event (``error_code == "TRIPWIRE_STOPPED"``) and as a
:class:`~tripwire.integrations.StoppedRun` from :meth:`TripwirePlugin.stopped_run` (or
:func:`run`, which returns it). Every invocation hands its receipt to ``on_receipt``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from typing import Any, Final

from tripwire.core.budget import NO_LIMITS, Limits
from tripwire.errors import ConfigError, RunStopped
from tripwire.integrations._common import (
    RunControl,
    RunSettings,
    StoppedRun,
)

try:
    from google.adk.models.llm_response import LlmResponse
    from google.adk.plugins.base_plugin import BasePlugin
    from google.genai import types
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tripwire.integrations.google_adk needs Google ADK: pip install 'tripwire[google-adk]'"
    ) from exc

__all__ = ["STOPPED_ERROR_CODE", "TripwirePlugin", "run"]

STOPPED_ERROR_CODE: Final = "TRIPWIRE_STOPPED"
"""The ``error_code`` of the event with which tripwire ends an invocation."""

_KEEP_STOPPED: Final = 256
"""How many stopped invocations' results the plugin keeps for :meth:`stopped_run`."""


def _text(response: Any) -> str | None:
    content = getattr(response, "content", None)
    parts = getattr(content, "parts", None) or ()
    texts = [p.text for p in parts if getattr(p, "text", None) and not getattr(p, "thought", None)]
    return "".join(texts) if texts else None


class TripwirePlugin(RunSettings, BasePlugin):
    """An ADK plugin that puts every invocation of its Runner under a fresh Guard.

    Args:
        limits: each invocation's budgets (default none: only count).
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (the kill switch, default) or ``"nudge"`` (one message first).
        agent: the agent's name on receipts (default the root agent's ``name``).
        on_receipt: called once with each invocation's receipt (e.g. a store's ``save``).
        partial_answer: builds a partial answer from the run state when tripwire stops a run.
        name: the plugin's name in the Runner.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``,
            ``prices``, ``clock``, ``normalizer``).

    Raises:
        ConfigError: a setting is invalid (names the field).
    """

    def __init__(
        self, limits: Limits = NO_LIMITS, *, name: str = "tripwire", **settings: Any
    ) -> None:
        BasePlugin.__init__(self, name=name)
        RunSettings.__init__(self, limits, **settings)
        self._lock = threading.Lock()
        self._runs: dict[str, RunControl] = {}
        self._stopped: OrderedDict[str, StoppedRun] = OrderedDict()
        self._refused: set[tuple[str, str | None]] = set()
        """(invocation, call id) of calls not run: ADK's after-tool callbacks see our dict."""

    # -- runs -------------------------------------------------------------------------------

    def _control(self, invocation_id: str, agent: str = "agent") -> RunControl:
        with self._lock:
            control = self._runs.get(invocation_id)
            if control is None:
                control = self._runs[invocation_id] = self.new_run(agent)
            return control

    def stopped_run(self, invocation_id: str) -> StoppedRun | None:
        """The :class:`~tripwire.integrations.StoppedRun` of an invocation tripwire stopped
        (the latest few hundred are kept), else ``None``."""
        with self._lock:
            return self._stopped.get(invocation_id)

    async def before_run_callback(self, *, invocation_context: Any) -> None:
        agent = getattr(invocation_context.agent, "name", None) or "agent"
        self._control(invocation_context.invocation_id, agent)

    async def after_run_callback(self, *, invocation_context: Any) -> None:
        self._end(invocation_context.invocation_id)

    async def on_run_error_callback(self, *, invocation_context: Any, error: Exception) -> None:
        self._end(invocation_context.invocation_id, error=error)

    def _end(self, invocation_id: str, *, error: BaseException | None = None) -> None:
        with self._lock:
            control = self._runs.pop(invocation_id, None)
            self._refused = {k for k in self._refused if k[0] != invocation_id}
        if control is None:
            return
        stopped = control.stopped
        if stopped is None:
            if error is not None:  # never "completed": a crash, or a user abort
                control.failed(error)
            else:
                control.finish()
            return
        result = control.stop_result(stopped)
        with self._lock:
            self._stopped[invocation_id] = result
            while len(self._stopped) > _KEEP_STOPPED:
                self._stopped.popitem(last=False)

    # -- model calls ------------------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: Any, llm_request: Any
    ) -> LlmResponse | None:
        control = self._control(callback_context.invocation_id)
        try:
            control.before_model()
        except RunStopped as exc:
            return LlmResponse(error_code=STOPPED_ERROR_CODE, error_message=str(exc))
        wrap = control.wrap_up()
        if wrap is not None:
            # The graceful last step: no tools, and the instruction to answer now.
            llm_request.config.tools = None
            llm_request.tools_dict = {}
            llm_request.append_instructions([wrap])
        return None

    async def after_model_callback(
        self, *, callback_context: Any, llm_response: Any
    ) -> LlmResponse | None:
        if getattr(llm_response, "partial", False):
            return None  # streamed chunks: the final response carries the usage
        control = self._control(callback_context.invocation_id)
        text = _text(llm_response)
        if text is not None:
            control.note_answer(text)
        usage = getattr(llm_response, "usage_metadata", None)
        # A budget stop here is kept on the control: the next model call or tool call of this
        # invocation ends it (the callback must not raise, see the module doc).
        with contextlib.suppress(RunStopped):
            control.after_model(
                model=getattr(llm_response, "model_version", None)
                or getattr(callback_context, "model", None),
                input_tokens=getattr(usage, "prompt_token_count", None) or 0,
                output_tokens=getattr(usage, "candidates_token_count", None) or 0,
            )
        return None

    # -- tool calls -------------------------------------------------------------------------

    async def before_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any
    ) -> dict[str, Any] | None:
        control = self._control(tool_context.invocation_id)
        stopped = control.stopped
        if stopped is not None:  # a sibling in the batch of the call that stopped the run
            return self._refuse(tool_context, self._stop_tool(tool_context, stopped))
        try:
            refusal = control.before_tool(tool.name, tool_args)
        except RunStopped as exc:
            return self._refuse(tool_context, self._stop_tool(tool_context, exc))
        if refusal is not None:
            return self._refuse(tool_context, {"result": refusal})
        return None

    def _refuse(self, tool_context: Any, response: dict[str, Any]) -> dict[str, Any]:
        # ADK runs the after-tool callbacks on this dict too: it is not the tool's result.
        with self._lock:
            self._refused.add((tool_context.invocation_id, tool_context.function_call_id))
        return response

    async def after_tool_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, result: Any
    ) -> dict[str, Any] | None:
        key = (tool_context.invocation_id, tool_context.function_call_id)
        with self._lock:
            if key in self._refused:
                self._refused.discard(key)
                return None
        control = self._control(tool_context.invocation_id)
        try:
            control.after_tool(tool.name, tool_args, result)
        except RunStopped as exc:
            return self._stop_tool(tool_context, exc)
        return None

    async def on_tool_error_callback(
        self, *, tool: Any, tool_args: dict[str, Any], tool_context: Any, error: Exception
    ) -> dict[str, Any] | None:
        if isinstance(error, BaseException) and not isinstance(error, Exception):
            return None  # cancelled: nothing ran to the end
        control = self._control(tool_context.invocation_id)
        try:
            control.after_tool(tool.name, tool_args, error=error)
        except RunStopped as exc:
            return self._stop_tool(tool_context, exc)
        return None

    @staticmethod
    def _stop_tool(tool_context: Any, exc: RunStopped) -> dict[str, Any]:
        # skip_summarization makes this tool response the invocation's final event: ADK makes
        # no further model call after it.
        tool_context.actions.skip_summarization = True
        return {"error": str(exc), "error_code": STOPPED_ERROR_CODE}


async def run(
    runner: Any, *, user_id: str, session_id: str, new_message: types.Content, **options: Any
) -> list[Any] | StoppedRun:
    """One ``runner.run_async(...)`` to its end, through a Runner with a :class:`TripwirePlugin`.

    Returns:
        The invocation's events when it ended by itself, a
        :class:`~tripwire.integrations.StoppedRun` when tripwire stopped it.

    Raises:
        ConfigError: the runner has no :class:`TripwirePlugin`.
    """
    plugins = getattr(getattr(runner, "plugin_manager", None), "plugins", None) or ()
    plugin = next((p for p in plugins if isinstance(p, TripwirePlugin)), None)
    if plugin is None:
        raise ConfigError("runner", runner, "a Runner with plugins=[TripwirePlugin(...)]")
    events: list[Any] = []
    async for event in runner.run_async(
        user_id=user_id, session_id=session_id, new_message=new_message, **options
    ):
        events.append(event)
    invocation = next((e.invocation_id for e in reversed(events) if e.invocation_id), None)
    stopped = plugin.stopped_run(invocation) if invocation is not None else None
    return stopped if stopped is not None else events
