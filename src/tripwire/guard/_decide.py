"""The guard's own decisions, as pure functions of values: nudges, last steps, stops.

No state, no clock, no I/O: the guard hands in what it knows and raises or returns the result.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from tripwire.core.budget import Advisory, Level, Limits, RunCounters, Stop, check_before_step
from tripwire.core.reasons import Rule, StopReason
from tripwire.core.watch import Assessment

__all__ = [
    "SOFT_STOPS",
    "last_step_stop",
    "nudge_advisory",
    "nudge_message",
    "timeout_stop",
    "unavailable_stop",
    "wrap_up_advisory",
]

SOFT_STOPS: Final = frozenset(
    {
        StopReason.MAX_TOOL_CALLS,
        StopReason.MAX_TOOL_CALLS_FOR_TOOL,
        StopReason.MAX_DUPLICATE_CALLS,
        StopReason.MAX_SUBAGENTS,
    }
)
"""Stops that refuse tool calls (or sub-agents) only: the model still gets one tool-less step
to give its final answer."""

_LIMIT_REASONS: Final = {
    "max_steps": StopReason.MAX_STEPS,
    "max_cost_usd": StopReason.MAX_COST,
    "max_input_tokens": StopReason.MAX_INPUT_TOKENS,
    "max_output_tokens": StopReason.MAX_OUTPUT_TOKENS,
    "max_total_tokens": StopReason.MAX_TOTAL_TOKENS,
    "max_duration_s": StopReason.MAX_DURATION,
    "max_no_progress_steps": StopReason.NO_PROGRESS,
}
"""The stop reason of each limit that can restrict the last step."""

_NUDGE_HINT: Final = "Try a different approach, or stop and report what you found."


def nudge_message(assessment: Assessment) -> str:
    """The message a nudge shows the model: what it repeated, in words, and what to do.

    Names the tool and the counts, never the arguments.
    """
    tool, hits = assessment.tool or "a tool", assessment.hits
    rule = assessment.rule
    if rule is Rule.RETRY_OF_NON_RETRYABLE:
        what = (
            f"You called {tool} again with the same arguments after it failed with an error "
            "that retrying cannot fix."
        )
    elif rule is Rule.PERIOD:
        what = (
            f"You repeated the same cycle of {assessment.period} tool calls, ending with {tool}, "
            f"{hits} times, and it returned the same results."
        )
    elif rule is Rule.SAME_ERROR:
        what = f"Your last {hits} tool calls, ending with {tool}, failed with the same error."
    elif rule is Rule.FAILURES:
        what = f"{hits} of your last {assessment.window} tool calls failed."
    elif rule is Rule.SAME_RESULT:
        what = f"You called {tool} {hits} times in a row and it returned the same result each time."
    elif rule is Rule.REVISIT:
        what = (
            f"Your last {hits} tool calls, ending with {tool}, repeated earlier calls and got "
            "the same results."
        )
    else:
        what = (
            f"You called {tool} with the same arguments {hits} times and it returned the same "
            "result."
        )
    return f"{what} {_NUDGE_HINT}"


def nudge_advisory(assessment: Assessment) -> Advisory:
    """The soft refusal a nudge hands the model instead of running the call."""
    return Advisory(
        level=Level.RESTRICT,
        message=nudge_message(assessment),
        limit_name="loop",
        remaining=None,
        allowed=False,
    )


def wrap_up_advisory(stop: Stop, limits: Limits) -> Advisory:
    """The advisory of the tool-less last step after a tool-call cap stopped the run."""
    limit = int(stop.limit) if float(stop.limit).is_integer() else stop.limit
    left = f"No tool calls left ({stop.limit_name}={limit} reached)"
    return Advisory(
        level=Level.RESTRICT,
        message=limits.messages.restrict.format(
            left=left, limit_name=stop.limit_name, limit=limit, used=limit, remaining=0
        ),
        limit_name=stop.limit_name,
        remaining=0,
    )


def last_step_stop(advisory: Advisory, limits: Limits, steps: int) -> Stop:
    """The stop a run ends on after the last step that ``advisory`` restricted.

    ``steps`` is the number of steps started (the last one included).
    """
    name = advisory.limit_name or ""
    if name == "max_steps":
        natural = check_before_step(
            replace(limits, max_duration_s=None), RunCounters(steps=steps)
        )
        if isinstance(natural, Stop):
            return natural
    limit = getattr(limits, name, None)
    value = float(limit) if isinstance(limit, (int, float)) else 0.0
    remaining = advisory.remaining if advisory.remaining is not None else 0.0
    used = max(value - remaining, 0.0)
    return Stop(
        reason=_LIMIT_REASONS.get(name, StopReason.MAX_STEPS),
        limit_name=name,
        limit=value,
        observed=used,
        counter=name.removeprefix("max_"),
        used=used,
        message=(
            f"The run's last step ran near its {name} limit and was told to answer without "
            f"tools; the run ends there. Raise Limits({name}=...) for longer runs"
        ),
    )


def unavailable_stop(
    reason: StopReason,
    limit_name: str,
    limit: float,
    counter: str,
    used: float,
    *,
    share_spent: bool = False,
) -> Stop:
    """The stop when the shared ledger is unreachable and ``on_unavailable='fail_closed'``, or
    (``share_spent``) when it is unreachable and this process spent its ``outage_share``.

    ``used`` is the counter's last known value (what the run really spent), never NaN.
    """
    if share_spent:
        message = (
            f"The shared budget ledger is unreachable and this process has spent its share of "
            f"{limit_name} for an outage (outage_share), so the run stops ({counter}={used:g} "
            "when the ledger last answered): other processes may be spending the rest. "
            "Restore the ledger, or raise outage_share"
        )
    else:
        message = (
            f"The shared budget ledger is unreachable and on_unavailable='fail_closed': "
            f"{limit_name} cannot be checked, so the run stops ({counter}={used:g} when it was "
            "last reached). Restore the ledger, or choose on_unavailable='fail_open'"
        )
    return Stop(
        reason=reason,
        limit_name=limit_name,
        limit=limit,
        observed=used,
        counter=counter,
        used=used,
        message=message,
    )


def timeout_stop(label: str, name: str, limit: float, elapsed: float) -> Stop:
    """The stop when a tool call did not finish within its own timeout."""
    return Stop(
        reason=StopReason.MAX_DURATION,
        limit_name=name,
        limit=limit,
        observed=elapsed,
        counter="tool_duration_s",
        used=elapsed,
        message=(
            f"{label} did not finish within {name}={limit:g} s; the call was "
            "abandoned. Answer from the work done so far, or raise "
            "Limits(tool_timeout_s=...)"
        ),
        tool=label,
    )
