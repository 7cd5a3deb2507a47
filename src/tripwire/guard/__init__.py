"""The run guard: what an agent runner calls around every step and tool call.

A thin, thread-safe shell over :mod:`tripwire.core.budget` (limits, levels, checks) and
:mod:`tripwire.core.watch` (the loop watcher)::

    guard = Guard(Limits(max_steps=20, max_cost_usd=0.50, tool_caps={"send_email": 1}))
    guard.partial_answer = lambda snap: summarize(history)     # optional
    while True:
        advisory = guard.before_step()            # may raise BudgetExceeded
        if not advisory.ok:
            messages.append(system(advisory.message))
        reply = model(messages, tools=None if advisory.level == "restrict" else tools)
        guard.record_usage(model=reply.model, input_tokens=..., output_tokens=...)
        if not reply.tool_calls:
            guard.finish(); break
        batch = [(c.name, c.args) for c in reply.tool_calls]
        verdict = guard.before_tools(batch)       # the whole batch, before any of it runs
        if not verdict.allowed:                   # restricted or nudged: tell the model
            ...; continue
        for name, args in batch:
            result = guard.timeout(run_tool, None, name, args)
            guard.after_tool(name, args, ToolResult.success(result))   # may raise LoopDetected

The guard raises only :class:`~tripwire.errors.RunStopped` subclasses, on purpose:
:class:`~tripwire.errors.BudgetExceeded` (one :class:`StopReason`, the limit that fired, the
counters, the partial answer) and :class:`~tripwire.errors.LoopDetected`. Once it has raised,
the run is stopped: every later check raises the same exception again, and is counted
(:attr:`Guard.after_stop`), so a receipt never claims a stop the framework swallowed.
Everything else it returns as an :class:`~tripwire.core.budget.Advisory`.

Loops are refused, not reported: ``before_tool(s)`` asks the watcher
(:func:`tripwire.core.watch.preview`) whether the call would make the run ``stuck`` and raises
:class:`~tripwire.errors.LoopDetected` before the tool body runs. With ``on_loop="nudge"`` the
first such call is refused softly instead (an advisory naming what was repeated); the next
call at which a loop rule trips stops the run.

Thread-safety: one lock per guard; the ledger has its own. Asyncio: nothing awaits under the
lock and the in-process path never blocks, so the sync methods may be called from coroutines;
the ``a``-prefixed variants move calls to a worker thread when the ledger is remote (Redis).

The package: ``_guard`` (the :class:`Guard` shell), ``_decide`` (its pure decisions: nudges,
the last step, stops), ``_ledger`` (counters by name, plans, the view of the ledger) and
``_values`` (the snapshot and the modes).
"""

from __future__ import annotations

from tripwire.guard._decide import nudge_message
from tripwire.guard._guard import Guard
from tripwire.guard._values import INHERIT, GuardSnapshot, Inherit, OnLoop

__all__ = ["INHERIT", "Guard", "GuardSnapshot", "Inherit", "OnLoop", "nudge_message"]
