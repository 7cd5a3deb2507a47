"""The guard's values: its snapshot, the loop-handling mode and the "inherit" marker."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, Literal

from tripwire.core.budget import Limits, RunCounters, Stop
from tripwire.core.reasons import StopReason, Verdict
from tripwire.core.watch import Assessment

__all__ = ["INHERIT", "GuardSnapshot", "Inherit", "OnLoop"]

OnLoop = Literal["stop", "nudge"]
"""What the guard does the first time a call would make the run ``stuck``: ``"stop"`` raises
:class:`~tripwire.errors.LoopDetected` before the call runs; ``"nudge"`` refuses that call
softly with a message for the model, and stops the run at the next call at which a loop rule
trips."""


class Inherit(Enum):
    """The type of :data:`INHERIT`: "take the parent's value", distinct from ``None`` (off)."""

    INHERIT = "inherit"


INHERIT: Final = Inherit.INHERIT
"""``Guard.subagent(loop_policy=INHERIT)`` (the default): the child uses its parent's loop
policy. ``None`` would switch the child's loop detection off, so the two must differ."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardSnapshot:
    """The guard's state at one moment: counters, and why the run stopped (if it did)."""

    run_id: str
    counters: RunCounters
    """What the run consumed (shared counters include sub-agents' use)."""
    reason: StopReason | None
    """Why the run stopped; ``None`` while it runs."""
    stop: Stop | None
    """The budget limit that fired, with its values (``None`` unless a budget stopped it)."""
    loop: Assessment | None
    """The loop assessment that stopped the run (or refused a non-retryable retry)."""
    verdict: Verdict
    """The loop watcher's verdict in force (``working`` when the watcher is off)."""
    policy_version: str | None
    """The loop policy's version (``None`` when loop detection is off)."""
    normalizer_version: str
    """The signature normalizer's version."""
    limits: Limits
    """The run's own limits."""
    nudge: Assessment | None = None
    """The loop assessment a nudge was given for (``on_loop="nudge"``), else ``None``."""
    after_stop_model_calls: int = 0
    """Model calls attempted after the guard stopped the run (the framework went on)."""
    after_stop_tool_calls: int = 0
    """Tool calls attempted after the guard stopped the run (the framework went on)."""
    origin: Mapping[str, str | float | None] | None = None
    """Who stopped the run from outside (``Guard.stop``): ``source``, ``by``, ``at``."""

    @property
    def condition(self) -> dict[str, str | int | float | bool | None]:
        """The inputs of the condition that fired, e.g. ``{"tool_calls": 20, "requested": 1,
        "max_tool_calls": 20}`` (empty while running); ``nudged_at_call`` when a nudge was
        given. A stop from outside (an operator's kill, the fleet's verdict) adds ``source``,
        ``by`` and ``at``; a run ended by its framework's own cap (no tripwire limit fired)
        gives its ``steps`` and ``tool_calls``."""
        out: dict[str, str | int | float | bool | None] = {}
        stop = self.stop
        if stop is not None:
            if self.origin is None or stop.reason is not StopReason.USER_CANCELLED:
                out = stop.condition  # an operator's kill has no limit inputs
        elif self.loop is not None:
            a = self.loop
            out = {
                "rule": a.rule.value if a.rule else None,
                "tool": a.tool,
                "hits": a.hits,
                "window": a.window,
                "period": a.period,
                "call_index": a.call_index,
            }
        elif self.reason is not None and self.reason is not StopReason.COMPLETED:
            out = {"steps": self.counters.steps, "tool_calls": self.counters.tool_calls}
        if self.origin is not None:
            out.update(self.origin)
        if self.nudge is not None:
            out["nudged_at_call"] = self.nudge.call_index
        return out
