"""tripwire inside LangChain v1 and LangGraph: a middleware, and a callback handler.

``create_agent`` (LangChain v1): one middleware::

    from langchain.agents import create_agent
    from tripwire.integrations.langchain import TripwireMiddleware

    agent = create_agent(model, tools, middleware=[TripwireMiddleware(Limits(max_steps=20))])
    out = agent.invoke({"messages": [...]})
    stopped = out.get("tripwire")        # a StoppedRun when tripwire ended the run, else absent

The middleware refuses a call before its tool body runs (``wrap_tool_call``), hands the nudge or
a budget refusal back to the model as the tool's result, makes the graceful last step without
tools (``wrap_model_call``), reads usage from the model's own ``AIMessage.usage_metadata``, and
ends a stopped run the way LangChain's own limit middleware does: ``jump_to: "end"`` with a
final ``AIMessage`` (the partial answer, or the stop's message). The
:class:`~tripwire.integrations.StoppedRun` is in the output under ``"tripwire"``.

``create_react_agent`` and any other graph or runnable: a callback handler::

    from tripwire.integrations.langchain import TripwireCallbackHandler

    handler = TripwireCallbackHandler(Limits(max_steps=20))
    out = handler.invoke(graph, {"messages": [...]})   # the output, or a StoppedRun

A callback cannot take the tools away from a model call: on ``create_react_agent``, pass
``handler.dynamic_model(model, tools)`` as the model for the graceful last step (LangGraph's
own per-step model choice); any other graph needs the middleware for it.

``raise_error = True``: the stop is raised from the callback before the model call or the tool
body it refuses, so it ends the run (``graph.invoke(..., {"callbacks": [handler]})`` raises the
:class:`~tripwire.errors.RunStopped`, receipt attached; :meth:`TripwireCallbackHandler.invoke`
turns it into a :class:`~tripwire.integrations.StoppedRun`), without LangChain's "Error in …
callback" warning, which stays for every other error of a callback. A callback cannot replace a tool's
result, so it cannot nudge: with ``on_loop="nudge"`` use the middleware, or pass
``handler.wrap_tool_call`` to ``ToolNode(tools, wrap_tool_call=...)``.

Runs are told apart by the root run id (callbacks) or a private state key (middleware): one
handler or middleware serves many runs at once, in threads or asyncio tasks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final
from uuid import UUID

from tripwire.core.budget import NO_LIMITS, Limits
from tripwire.core.policy import DEFAULT_POLICY, LoopPolicy
from tripwire.errors import ConfigError, RunStopped
from tripwire.integrations._common import (
    OnLoop,
    PartialAnswer,
    ReceiptSink,
    RunControl,
    StoppedRun,
    new_run,
)

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, hook_config
    from langchain.agents.middleware.types import PrivateStateAttr
    from langchain_core.callbacks import BaseCallbackHandler
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
    from langchain_core.runnables import RunnableLambda
    from langgraph.channels.untracked_value import UntrackedValue
    from langgraph.config import get_config
    from typing_extensions import NotRequired
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "tripwire.integrations.langchain needs LangChain v1 and LangGraph: "
        "pip install 'tripwire[langchain]'"
    ) from exc

__all__ = ["TripwireCallbackHandler", "TripwireMiddleware", "TripwireState"]

logger = logging.getLogger("tripwire.integrations")

_MAX_RUNS: Final = 4096
"""Most runs one middleware or handler tracks at once (the oldest is dropped past it)."""


class _QuietStops(logging.Filter):
    """Drops LangChain's "Error in TripwireCallbackHandler.<event> callback" warning for the
    stops the handler raises on purpose (``raise_error`` re-raises them; the caller gets the
    stop or a :class:`~tripwire.integrations.StoppedRun`). Any other error of a callback,
    tripwire's own included, is still logged."""

    def __init__(self) -> None:
        super().__init__()
        self._stops: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def expect(self, stop: RunStopped) -> None:
        """The handler is about to raise ``stop`` out of a callback."""
        with self._lock:
            self._stops[repr(stop)] = None
            while len(self._stops) > 256:
                self._stops.popitem(last=False)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if (
            record.msg != "Error in %s.%s callback: %s"
            or not isinstance(args, tuple)
            or len(args) != 3
            or not isinstance(args[2], str)
        ):
            return True
        with self._lock:
            return args[2] not in self._stops


_QUIET = _QuietStops()
logging.getLogger("langchain_core.callbacks.manager").addFilter(_QUIET)


def _quiet(callback: Callable[..., None]) -> Callable[..., None]:
    """A callback whose stops are raised without LangChain's error warning."""

    @functools.wraps(callback)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            callback(*args, **kwargs)
        except RunStopped as stop:
            _QUIET.expect(stop)
            raise

    return wrapper


class TripwireState(AgentState[Any]):
    """The agent state with tripwire's keys."""

    tripwire_run: NotRequired[Annotated[str, UntrackedValue, PrivateStateAttr]]
    """This invocation's run id (private, not checkpointed)."""
    tripwire: NotRequired[Annotated[StoppedRun, UntrackedValue]]
    """The :class:`~tripwire.integrations.StoppedRun`, when tripwire ended the run."""


class _Settings:
    """What every run of one middleware or handler is started with."""

    def __init__(
        self,
        limits: Limits,
        loop_policy: LoopPolicy | None,
        on_loop: OnLoop | str,
        agent: str,
        on_receipt: ReceiptSink | None,
        partial_answer: PartialAnswer | None,
        guard_options: dict[str, Any],
    ) -> None:
        if not isinstance(limits, Limits):
            raise ConfigError("limits", limits, "a tripwire Limits")
        try:
            self.on_loop = OnLoop(on_loop)
        except ValueError:
            raise ConfigError("on_loop", on_loop, "'stop' or 'nudge'") from None
        self.limits = limits
        self.loop_policy = loop_policy
        self.agent = agent
        self.on_receipt = on_receipt
        self.partial_answer = partial_answer
        self.guard_options = guard_options
        self._runs: OrderedDict[str, RunControl] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, key: str) -> RunControl:
        run = new_run(
            self.limits,
            loop_policy=self.loop_policy,
            on_loop=self.on_loop,
            agent=self.agent,
            on_receipt=self.on_receipt,
            partial_answer=self.partial_answer,
            **self.guard_options,
        )
        with self._lock:
            self._runs[key] = run
            while len(self._runs) > _MAX_RUNS:
                self._runs.popitem(last=False)
        return run

    def get(self, key: str | None) -> RunControl | None:
        if key is None:
            return None
        with self._lock:
            return self._runs.get(key)

    def pop(self, key: str | None) -> RunControl | None:
        if key is None:
            return None
        with self._lock:
            return self._runs.pop(key, None)


def _usage(message: Any) -> tuple[str | None, int, int]:
    """(model name, input tokens, output tokens) from an ``AIMessage``."""
    usage = getattr(message, "usage_metadata", None) or {}
    meta = getattr(message, "response_metadata", None) or {}
    model = meta.get("model_name") or meta.get("model") if isinstance(meta, dict) else None
    return (
        model if isinstance(model, str) else None,
        usage.get("input_tokens", 0) if isinstance(usage, dict) else 0,
        usage.get("output_tokens", 0) if isinstance(usage, dict) else 0,
    )


def _final_text(messages: Any) -> Any:
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, AIMessage) and not message.tool_calls:
                return message.content
    return None


def _end_message(stopped: StoppedRun) -> AIMessage:
    text = stopped.partial if isinstance(stopped.partial, str) and stopped.partial else None
    return AIMessage(
        content=text or f"Run stopped by tripwire ({stopped.reason.value}): {stopped.message}",
        name="tripwire",
    )


def _tool_message(request: Any, text: str, *, error: bool = False) -> ToolMessage:
    call = request.tool_call
    return ToolMessage(
        content=text,
        tool_call_id=call.get("id") or "",
        name=call.get("name"),
        status="error" if error else "success",
    )


class _ToolGate:
    """The tool-call check shared by the middleware and the ``ToolNode`` interceptor."""

    def _run_for_tool(self, request: Any) -> RunControl | None:
        raise NotImplementedError

    def _gate(self, request: Any) -> tuple[RunControl | None, ToolMessage | None]:
        run = self._run_for_tool(request)
        if run is None:
            return None, None
        call = request.tool_call
        if run.stopped is not None:  # a sibling in the batch of the call that stopped the run
            return run, _tool_message(request, str(run.stopped), error=True)
        try:
            refusal = run.before_tool(call["name"], call.get("args", {}))
        except RunStopped as exc:
            # Not run. The graph ends at its next model step (before_model jumps to the end).
            return run, _tool_message(request, str(exc), error=True)
        if refusal is not None:
            return run, _tool_message(request, refusal)
        return run, None

    @staticmethod
    def _after(run: RunControl, request: Any, result: Any) -> None:
        call = request.tool_call
        with contextlib.suppress(RunStopped):  # kept on run.stopped: the next step ends it
            run.after_tool(call["name"], call.get("args", {}), result)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Refuse a tool call before it runs, or run it and feed its result to the watcher."""
        run, refused = self._gate(request)
        if refused is not None:
            return refused
        if run is None:
            return handler(request)
        try:
            result = handler(request)
        except Exception as exc:
            self._after_error(run, request, exc)
            raise
        self._after(run, request, result)
        return result

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """The async :meth:`wrap_tool_call`."""
        run, refused = self._gate(request)
        if refused is not None:
            return refused
        if run is None:
            return await handler(request)
        try:
            result = await handler(request)
        except Exception as exc:
            self._after_error(run, request, exc)
            raise
        self._after(run, request, result)
        return result

    @staticmethod
    def _after_error(run: RunControl, request: Any, exc: Exception) -> None:
        call = request.tool_call
        with contextlib.suppress(RunStopped):  # kept on run.stopped
            run.after_tool(call["name"], call.get("args", {}), error=exc)


# -- create_agent: the middleware ----------------------------------------------------------


class TripwireMiddleware(_ToolGate, AgentMiddleware[TripwireState, Any, Any]):
    """The LangChain v1 ``create_agent`` middleware: loops, budgets and a receipt per run.

    Args:
        limits: the run's budgets.
        loop_policy: the loop watcher's policy; ``None`` switches loop detection off.
        on_loop: ``"stop"`` (default, the kill switch) or ``"nudge"``.
        agent: the name on receipts.
        on_receipt: called once per run with its receipt.
        partial_answer: builds a partial answer from the run state when tripwire stops it.
        **guard_options: further :class:`~tripwire.guard.Guard` options (``ledger``, ``prices``).
    """

    state_schema = TripwireState

    def __init__(
        self,
        limits: Limits = NO_LIMITS,
        *,
        loop_policy: LoopPolicy | None = DEFAULT_POLICY,
        on_loop: OnLoop | str = OnLoop.STOP,
        agent: str = "agent",
        on_receipt: ReceiptSink | None = None,
        partial_answer: PartialAnswer | None = None,
        **guard_options: Any,
    ) -> None:
        super().__init__()
        self.settings = _Settings(
            limits, loop_policy, on_loop, agent, on_receipt, partial_answer, guard_options
        )
        self.tools = []

    def _run_for_tool(self, request: Any) -> RunControl | None:
        state = request.state
        return self.settings.get(state.get("tripwire_run") if isinstance(state, dict) else None)

    def run_of(self, state: Any) -> RunControl | None:
        """The :class:`~tripwire.integrations.RunControl` of the run whose state this is."""
        return self.settings.get(state.get("tripwire_run") if isinstance(state, dict) else None)

    # -- the run ----------------------------------------------------------------------------

    def before_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        key = uuid.uuid4().hex
        self.settings.start(key)
        return {"tripwire_run": key}

    async def abefore_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_agent(state, runtime)

    def after_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        run = self.settings.pop(state.get("tripwire_run"))
        if run is not None and run.stopped is None:
            run.finish(_final_text(state.get("messages")))
        return None

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_agent(state, runtime)

    def _end(self, run: RunControl, exc: RunStopped) -> dict[str, Any]:
        stopped = run.stop_result(exc)
        return {"jump_to": "end", "messages": [_end_message(stopped)], "tripwire": stopped}

    # -- model steps ------------------------------------------------------------------------

    @hook_config(can_jump_to=["end"])
    def before_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        run = self.run_of(state)
        if run is None:
            return None
        if run.stopped is not None:
            return self._end(run, run.stopped)
        try:
            run.before_model()
        except RunStopped as exc:
            return self._end(run, exc)
        return None

    @hook_config(can_jump_to=["end"])
    async def abefore_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.before_model(state, runtime)

    @hook_config(can_jump_to=["end"])
    def after_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        run = self.run_of(state)
        if run is not None and run.stopped is not None:
            return self._end(run, run.stopped)  # e.g. the model call spent the token budget
        return None

    @hook_config(can_jump_to=["end"])
    async def aafter_model(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        return self.after_model(state, runtime)

    def _prepare(self, request: Any) -> tuple[RunControl | None, Any]:
        run = self.run_of(request.state)
        if run is None:
            return None, request
        wrap = run.wrap_up()
        if wrap is None:
            return run, request
        # The graceful last step: no tools, and the wrap-up instruction as the last message.
        return run, request.override(tools=[], messages=[*request.messages, HumanMessage(wrap)])

    @staticmethod
    def _record(run: RunControl, response: Any) -> None:
        messages = getattr(response, "result", None) or []
        for message in messages:
            if isinstance(message, AIMessage):
                model, tokens_in, tokens_out = _usage(message)
                if not message.tool_calls:
                    run.note_answer(message.content)
                with contextlib.suppress(RunStopped):  # kept: after_model ends the graph
                    run.after_model(model=model, input_tokens=tokens_in, output_tokens=tokens_out)
                return

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        run, request = self._prepare(request)
        response = handler(request)
        if run is not None:
            self._record(run, response)
        return response

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        run, request = self._prepare(request)
        response = await handler(request)
        if run is not None:
            self._record(run, response)
        return response


# -- any graph: the callback handler -------------------------------------------------------


class TripwireCallbackHandler(_ToolGate, BaseCallbackHandler):
    """A LangChain callback handler that stops runs: for ``create_react_agent`` and any graph.

    Every root run (a ``graph.invoke`` with this handler in its callbacks) gets its own guard.
    The stop is raised from ``on_chat_model_start`` / ``on_llm_start`` (before the model call)
    and ``on_tool_start`` (before the tool body); ``raise_error = True`` makes LangChain let it
    through instead of logging and dropping it.

    Args: as :class:`TripwireMiddleware` (``on_loop="nudge"`` needs ``wrap_tool_call`` on the
    ``ToolNode``: a callback cannot replace a tool's result).
    """

    raise_error = True
    """Stops raised in a callback end the run instead of being logged and dropped."""
    run_inline = True
    """Called on the thread of the run (async runs included), so the stop reaches the caller."""

    def __init__(
        self,
        limits: Limits = NO_LIMITS,
        *,
        loop_policy: LoopPolicy | None = DEFAULT_POLICY,
        on_loop: OnLoop | str = OnLoop.STOP,
        agent: str = "agent",
        on_receipt: ReceiptSink | None = None,
        partial_answer: PartialAnswer | None = None,
        **guard_options: Any,
    ) -> None:
        self.settings = _Settings(
            limits, loop_policy, on_loop, agent, on_receipt, partial_answer, guard_options
        )
        self._roots: OrderedDict[UUID, UUID] = OrderedDict()
        """Every run id seen → its root run id (bounded)."""
        self._tools: OrderedDict[UUID, tuple[str, Any]] = OrderedDict()
        """Tool run id → (tool, arguments): ``on_tool_end`` gets neither."""
        self._stopped_runs: OrderedDict[int, StoppedRun] = OrderedDict()
        """The structured result of each stop raised to the caller, by id of the exception."""
        self._gated: set[str] = set()
        """Tool call ids already checked by :meth:`wrap_tool_call` (not checked twice)."""
        self._lock = threading.Lock()
        self._warned = False
        self._counted: set[UUID] = set()
        """Root runs whose next model call ``dynamic_model`` already counted."""

    # -- run bookkeeping --------------------------------------------------------------------

    def _root(self, run_id: UUID, parent_run_id: UUID | None) -> UUID:
        with self._lock:
            root = (
                run_id if parent_run_id is None else self._roots.get(parent_run_id, parent_run_id)
            )
            self._roots[run_id] = root
            while len(self._roots) > _MAX_RUNS * 16:
                self._roots.popitem(last=False)
            return root

    def _run(self, run_id: UUID, parent_run_id: UUID | None) -> RunControl | None:
        return self.settings.get(str(self._root(run_id, parent_run_id)))

    def run_for(self, run_id: UUID) -> RunControl | None:
        """The :class:`~tripwire.integrations.RunControl` of the root run ``run_id``."""
        return self.settings.get(str(run_id))

    def _run_for_tool(self, request: Any) -> RunControl | None:
        config = getattr(getattr(request, "runtime", None), "config", None) or {}
        manager = config.get("callbacks") if isinstance(config, dict) else None
        parent = getattr(manager, "parent_run_id", None)
        if parent is None:
            return None
        with self._lock:
            root = self._roots.get(parent)
        run = self.run_for(root) if root is not None else None
        call_id = request.tool_call.get("id")
        if run is not None and call_id:
            with self._lock:
                self._gated.add(call_id)
                if len(self._gated) > _MAX_RUNS * 16:
                    self._gated.clear()
        return run

    # -- chains: run start and end -----------------------------------------------------------

    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is None:
            self._root(run_id, None)
            self.settings.start(str(run_id))
        else:
            self._root(run_id, parent_run_id)

    def on_chain_end(
        self, outputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        if parent_run_id is None:
            with self._lock:
                self._counted.discard(run_id)
            run = self.settings.pop(str(run_id))
            if run is not None:
                messages = outputs.get("messages") if isinstance(outputs, dict) else None
                if run.stopped is None:
                    run.finish(_final_text(messages))
                else:
                    run.stop_result(run.stopped)  # the graph swallowed the stop and ended

    def on_chain_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if parent_run_id is None:
            with self._lock:
                self._counted.discard(run_id)
            run = self.settings.pop(str(run_id))
            if run is not None:
                if isinstance(error, RunStopped):
                    stopped = run.stop_result(error)
                    if error.receipt is None:
                        error.receipt = stopped.receipt
                    with self._lock:
                        self._stopped_runs[id(error)] = stopped
                        while len(self._stopped_runs) > 64:
                            self._stopped_runs.popitem(last=False)
                else:  # a crash is never "completed"; a stop the graph re-raised keeps its reason
                    run.failed(error)

    # -- model calls --------------------------------------------------------------------------

    def _before_model(self, run_id: UUID, parent_run_id: UUID | None) -> None:
        root = self._root(run_id, parent_run_id)
        run = self.settings.get(str(root))
        if run is None:
            return
        if run.stopped is not None:
            # Raised before the model call, and raise_error lets it end the run: nothing
            # runs after the stop, so it is not counted as activity after it.
            raise run.stopped
        with self._lock:
            counted = root in self._counted
            self._counted.discard(root)
        if not counted:  # else dynamic_model counted this step before choosing the model
            run.before_model()

    # -- create_react_agent's dynamic model: the graceful last step ------------------------

    def dynamic_model(self, model: Any, tools: Any) -> Callable[[Any, Any], Any]:
        """``create_react_agent``'s model, chosen per step: the graceful last step on the
        callback path.

        ``create_react_agent(handler.dynamic_model(model, tools), ToolNode(tools,
        wrap_tool_call=handler.wrap_tool_call))``: each step is counted before its model is
        chosen; a normal step gets ``model.bind_tools(tools)``, and the last step (a step,
        token, cost or time budget nearly spent) gets ``model`` without tools and with the
        wrap-up instruction as the last message, so its answer ends the run and is kept.
        Without it, the callbacks alone cannot take the tools away: the model is asked with
        tools, the refused call ends the run one step later, and no answer is kept.

        Args:
            model: the chat model, without tools bound.
            tools: the tools (a list, or the ``ToolNode``) given to ``create_react_agent``.
        """
        by_name = getattr(tools, "tools_by_name", None)
        tool_list = list(by_name.values()) if isinstance(by_name, dict) else list(tools)
        bound = model.bind_tools(tool_list) if tool_list else model

        def choose(state: Any, runtime: Any) -> Any:
            root = self._graph_root()
            run = self.settings.get(str(root)) if root is not None else None
            if run is None or root is None:
                return bound
            if run.stopped is not None:
                raise run.stopped
            run.before_model()
            with self._lock:
                self._counted.add(root)
            wrap = run.wrap_up()
            if wrap is None:
                return bound
            instruction = HumanMessage(wrap)

            def last_step(value: Any) -> list[BaseMessage]:
                messages = value.to_messages() if hasattr(value, "to_messages") else list(value)
                return [*messages, instruction]

            return RunnableLambda(last_step) | model

        return choose

    def _graph_root(self) -> UUID | None:
        """The root run of the graph node running now (from LangGraph's config context)."""
        try:
            config = get_config()
        except RuntimeError:  # not inside a graph
            return None
        manager = config.get("callbacks")
        parent = getattr(manager, "parent_run_id", None)
        if parent is None:
            return None
        with self._lock:
            return self._roots.get(parent)

    @_quiet
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._before_model(run_id, parent_run_id)

    @_quiet
    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self._before_model(run_id, parent_run_id)

    @_quiet
    def on_llm_end(
        self, response: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        run = self._run(run_id, parent_run_id)
        if run is None:
            return
        model: str | None = None
        tokens_in = tokens_out = 0
        for generations in getattr(response, "generations", None) or []:
            for generation in generations:
                message = getattr(generation, "message", None)
                if message is not None:
                    model, tokens_in, tokens_out = _usage(message)
                    if isinstance(message, AIMessage) and not message.tool_calls:
                        run.note_answer(message.content)
                break
            break
        output = getattr(response, "llm_output", None) or {}
        if model is None and isinstance(output, dict):
            name = output.get("model_name")
            model = name if isinstance(name, str) else None
        run.after_model(model=model, input_tokens=tokens_in, output_tokens=tokens_out)

    # -- tool calls ---------------------------------------------------------------------------

    @_quiet
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        run = self._run(run_id, parent_run_id)
        if run is None:
            return
        name = kwargs.get("name") or (serialized or {}).get("name") or "tool"
        arguments: Any = inputs if inputs is not None else input_str
        call_id = kwargs.get("tool_call_id")
        with self._lock:
            gated = call_id in self._gated
            self._gated.discard(call_id)
            if not gated:  # else wrap_tool_call checks it and feeds its result to the watcher
                self._tools[run_id] = (name, arguments)
                while len(self._tools) > _MAX_RUNS * 16:
                    self._tools.popitem(last=False)
        if gated:
            return
        if run.stopped is not None:
            raise run.stopped  # before the tool body: it does not run
        if run.before_tool(name, arguments, refusable=False) is not None and not self._warned:
            # A callback cannot hand a refusal to the model in place of the result; the
            # ToolNode interceptor (wrap_tool_call) does that. Say so once, not silently.
            self._warned = True
            logger.warning(
                "tripwire refused a %s call (nudge or a budget near its end) but a callback "
                "cannot replace a tool's result, so it ran; pass "
                "ToolNode(tools, wrap_tool_call=handler.wrap_tool_call) to hand refusals "
                "to the model",
                name,
            )

    @_quiet
    def on_tool_end(
        self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        run = self._run(run_id, parent_run_id)
        with self._lock:
            call = self._tools.pop(run_id, None)
        if run is None or call is None:
            return
        run.after_tool(call[0], call[1], output)

    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        run = self._run(run_id, parent_run_id)
        with self._lock:
            call = self._tools.pop(run_id, None)
        if run is None or call is None or isinstance(error, RunStopped):
            return
        run.after_tool(call[0], call[1], error=error)

    # -- convenience ---------------------------------------------------------------------------

    def invoke(self, runnable: Any, inputs: Any, config: dict[str, Any] | None = None) -> Any:
        """``runnable.invoke(inputs, config)`` with this handler; a stop becomes a StoppedRun."""
        try:
            return runnable.invoke(inputs, self._config(config))
        except RunStopped as exc:
            return self._stopped(exc)

    async def ainvoke(
        self, runnable: Any, inputs: Any, config: dict[str, Any] | None = None
    ) -> Any:
        """``await runnable.ainvoke(inputs, config)`` with this handler; see :meth:`invoke`."""
        try:
            return await runnable.ainvoke(inputs, self._config(config))
        except RunStopped as exc:
            return self._stopped(exc)

    def _config(self, config: dict[str, Any] | None) -> dict[str, Any]:
        config = dict(config or {})
        callbacks = config.get("callbacks")
        if callbacks is None:
            config["callbacks"] = [self]
        elif isinstance(callbacks, list):
            config["callbacks"] = [*callbacks, self] if self not in callbacks else callbacks
        else:  # a callback manager
            callbacks.add_handler(self, inherit=True)
        return config

    def _stopped(self, exc: RunStopped) -> StoppedRun:
        with self._lock:
            stopped = self._stopped_runs.pop(id(exc), None)
        if stopped is None or stopped.error is not exc:
            raise exc  # not a stop of a run this handler watched (not a graph, or not ours)
        return stopped
