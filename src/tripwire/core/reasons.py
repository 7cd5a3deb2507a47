"""The closed vocabularies tripwire uses everywhere: verdicts, rules, stop reasons.

Enums subclass ``(str, Enum)`` so they serialize as their value and compare equal to it.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["ArgsKind", "Rule", "StopReason", "Verdict", "stop_reason_for"]


class Verdict(str, Enum):
    """What a run's recent activity means."""

    WORKING = "working"
    """No loop rule tripped, or the repetition came with new evidence of progress."""
    RETRYING = "retrying"
    """The repetition is a retry inside a declared retry policy."""
    WAITING = "waiting"
    """The repetition happens while a valid dependency lease (owner + deadline) exists."""
    STUCK = "stuck"
    """The actions repeat and nothing explains it: no lease, no retry policy, no progress."""
    UNCERTAIN = "uncertain"
    """A rule tripped but the evidence needed to decide is missing (see the reason)."""


class Rule(str, Enum):
    """The loop rule that tripped."""

    REPETITION = "repetition"
    """The same signature ``threshold`` times within the last ``window`` calls."""
    PERIOD = "period"
    """The trailing calls form a cycle of period 2..``max_period``, ``min_repeats`` times."""
    RETRY_OF_NON_RETRYABLE = "retry_of_non_retryable"
    """An identical call repeated after an error explicitly marked non-retryable."""
    SAME_ERROR = "same_error"
    """Consecutive calls keep failing with the same error, whatever their arguments."""
    SAME_RESULT = "same_result"
    """Consecutive calls of one tool all find nothing (an empty result), whatever their
    arguments: the agent varies the call but learns nothing new."""
    REVISIT = "revisit"
    """Consecutive calls (or most of the recent ones) each repeat an earlier call of the run and
    get the same result it got: activity without new evidence, in a cycle too long for the
    window."""
    FAILURES = "failures"
    """Most of the recent calls failed, whatever their tools, arguments and errors: a run
    fighting a broken environment instead of making progress."""


class ArgsKind(str, Enum):
    """How a signature's arguments were read; name-only keys are weaker evidence."""

    JSON = "json"
    """A dict or a JSON document, canonicalized."""
    TEXT = "text"
    """Text that is not JSON, hashed as text."""
    RAW = "raw"
    """Arguments above the canonicalization cap, hashed as raw bytes."""
    ABSENT = "absent"
    """No arguments recorded (capture switched off): the signature is the tool name only."""


class StopReason(str, Enum):
    """Why a run stopped: one enum, used by the guard, the receipts and the run store."""

    COMPLETED = "completed"
    MAX_STEPS = "max_steps"
    MAX_TOOL_CALLS = "max_tool_calls"
    MAX_TOOL_CALLS_FOR_TOOL = "max_tool_calls_for_tool"
    MAX_DUPLICATE_CALLS = "max_duplicate_calls"
    LOOP_DETECTED = "loop_detected"
    MAX_INPUT_TOKENS = "max_input_tokens"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    MAX_TOTAL_TOKENS = "max_total_tokens"
    MAX_COST = "max_cost"
    MAX_DURATION = "max_duration"
    NO_PROGRESS = "no_progress"
    MAX_SUBAGENTS = "max_subagents"
    RETRY_OF_NON_RETRYABLE = "retry_of_non_retryable"
    TOOL_ERROR = "tool_error"
    USER_CANCELLED = "user_cancelled"
    APPROVAL_REQUIRED = "approval_required"


def stop_reason_for(rule: Rule | None) -> StopReason:
    """The stop reason of a run stopped by loop ``rule``: the one rule → reason mapping.

    A retry of a call whose error was marked non-retryable has its own reason; every other
    loop rule (and ``None``, a loop stop whose rule was not recorded) is ``loop_detected``.
    """
    if rule is Rule.RETRY_OF_NON_RETRYABLE:
        return StopReason.RETRY_OF_NON_RETRYABLE
    return StopReason.LOOP_DETECTED
