"""Health of a stopped run: the priority table applied to a :class:`StopReceipt`.

:func:`classify` turns a receipt into a :class:`Health`: one :class:`HealthState` plus the
operator action it calls for. Priority, first match wins (see ``docs/receipts.md``):

===================================================  =======================
evidence                                             state
===================================================  =======================
a tool execution failed                              ``FAILED``
the run went on after its stop                       ``UNCERTAIN``
approval pending with owner, deadline, resume token  ``WAITING``
approval pending without routing data                ``WAITING_UNROUTED``
timed out with no valid progress (or loop stop)      ``STUCK``
step / token / cost / time / user-abort bound fired  ``BOUNDED_STOP``
done, with a passing outcome receipt                 ``VERIFIED_COMPLETE``
done, no receipt, policy requires none               ``COMPLETE_UNVERIFIED``
done, without a (passing) outcome receipt            ``FALSE_COMPLETE``
signals disagree, or no cause recorded               ``UNCERTAIN``
===================================================  =======================

The traps: a timeout at step 4 is a timeout even if the step cap was 4 (the classifier reads
the recorded cause, never the counters against the caps); a failed outcome receipt is not
verification; an LLM-judge receipt is evidence of its own kind, and any receipt checked by
the agent under review (``checked_by == agent``) does not count at all; a stop that the
framework swallowed (``after_stop`` shows activity) is no stop.

Pure: time comes in as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

from tripwire.core.reasons import StopReason, Verdict
from tripwire.core.receipt import (
    AfterStop,
    Approval,
    EndKind,
    Evidence,
    OutcomeRequirement,
    StopReceipt,
)
from tripwire.errors import ConfigError

__all__ = ["Health", "HealthState", "classify"]


class HealthState(str, Enum):
    """What a stopped run needs from an operator; see :attr:`operator_action`."""

    FAILED = "failed"
    """A tool execution failed and ended the run."""
    WAITING = "waiting"
    """The run asked for approval and the request is routed (owner, deadline, resume token)."""
    WAITING_UNROUTED = "waiting_unrouted"
    """The run asked for approval, but nobody is named to answer it (or the deadline passed)."""
    STUCK = "stuck"
    """The run timed out without valid progress, or was stopped by the loop detector."""
    BOUNDED_STOP = "bounded_stop"
    """A step / token / cost / time bound or a user abort ended a run that was not stuck."""
    VERIFIED_COMPLETE = "verified_complete"
    """The run finished and a check other than the agent itself confirmed the outcome."""
    COMPLETE_UNVERIFIED = "complete_unverified"
    """The run finished, its policy requires no outcome receipt, and none was given.

    Deliberately not ``VERIFIED_COMPLETE``: nothing beyond the control flow was checked.
    """
    FALSE_COMPLETE = "false_complete"
    """The run claims to be done, but no accepted outcome receipt passed (or one failed)."""
    UNCERTAIN = "uncertain"
    """The recorded signals disagree, or no stop cause was recorded."""

    @property
    def operator_action(self) -> str:
        """What the operator should do about a run in this state."""
        return _OPERATOR_ACTIONS[self]


_OPERATOR_ACTIONS: Final[Mapping[HealthState, str]] = {
    HealthState.FAILED: ("diagnose the tool boundary; do not blindly retry uncertain side effects"),
    HealthState.WAITING: "route the decision; keep it resumable",
    HealthState.WAITING_UNROUTED: "add an owner and an escalation path",
    HealthState.STUCK: "inspect the last durable progress; pick one bounded recovery",
    HealthState.BOUNDED_STOP: ("keep the partial work; decide if a new bounded run is justified"),
    HealthState.VERIFIED_COMPLETE: "close the run",
    HealthState.COMPLETE_UNVERIFIED: (
        "close the run; nothing beyond the control flow was checked, so add an outcome "
        "verifier if this agent changes anything outside itself"
    ),
    HealthState.FALSE_COMPLETE: "check the destination or reopen",
    HealthState.UNCERTAIN: "ask before acting",
}


class _Family(str, Enum):
    """Internal: the cause family an end kind or a stop reason belongs to."""

    DONE = "done"
    APPROVAL = "approval"
    TIME = "time"
    LOOP = "loop"
    BOUND = "bound"
    ABORT = "abort"
    FAILURE = "failure"


_END_FAMILIES: Final[Mapping[EndKind, frozenset[_Family]]] = {
    EndKind.NATURAL_FINISH: frozenset({_Family.DONE}),
    EndKind.EXPLICIT_DONE: frozenset({_Family.DONE}),
    EndKind.APPROVAL_REQUESTED: frozenset({_Family.APPROVAL}),
    EndKind.STOP_CONDITION: frozenset({_Family.BOUND, _Family.LOOP, _Family.TIME}),
    EndKind.USER_ABORT: frozenset({_Family.ABORT}),
    EndKind.TIMEOUT: frozenset({_Family.TIME}),
    EndKind.TOOL_FAILURE: frozenset({_Family.FAILURE}),
}
_END_DEFAULT_FAMILY: Final[Mapping[EndKind, _Family]] = {
    EndKind.NATURAL_FINISH: _Family.DONE,
    EndKind.EXPLICIT_DONE: _Family.DONE,
    EndKind.APPROVAL_REQUESTED: _Family.APPROVAL,
    EndKind.STOP_CONDITION: _Family.BOUND,
    EndKind.USER_ABORT: _Family.ABORT,
    EndKind.TIMEOUT: _Family.TIME,
    EndKind.TOOL_FAILURE: _Family.FAILURE,
}
_REASON_FAMILY: Final[Mapping[StopReason, _Family]] = {
    StopReason.COMPLETED: _Family.DONE,
    StopReason.APPROVAL_REQUIRED: _Family.APPROVAL,
    StopReason.TOOL_ERROR: _Family.FAILURE,
    StopReason.USER_CANCELLED: _Family.ABORT,
    StopReason.MAX_DURATION: _Family.TIME,
    StopReason.LOOP_DETECTED: _Family.LOOP,
    StopReason.NO_PROGRESS: _Family.LOOP,
    StopReason.RETRY_OF_NON_RETRYABLE: _Family.LOOP,
    StopReason.MAX_STEPS: _Family.BOUND,
    StopReason.MAX_TOOL_CALLS: _Family.BOUND,
    StopReason.MAX_TOOL_CALLS_FOR_TOOL: _Family.BOUND,
    StopReason.MAX_DUPLICATE_CALLS: _Family.BOUND,
    StopReason.MAX_INPUT_TOKENS: _Family.BOUND,
    StopReason.MAX_OUTPUT_TOKENS: _Family.BOUND,
    StopReason.MAX_TOTAL_TOKENS: _Family.BOUND,
    StopReason.MAX_COST: _Family.BOUND,
    StopReason.MAX_SUBAGENTS: _Family.BOUND,
}
_REASON_COUNTER: Final[Mapping[StopReason, str]] = {
    StopReason.MAX_STEPS: "steps",
    StopReason.MAX_TOOL_CALLS: "tool_calls",
    StopReason.MAX_INPUT_TOKENS: "input_tokens",
    StopReason.MAX_OUTPUT_TOKENS: "output_tokens",
    StopReason.MAX_TOTAL_TOKENS: "total_tokens",
    StopReason.MAX_COST: "cost_usd",
    StopReason.MAX_DURATION: "duration_s",
}
"""For a cap reason, the ``condition`` key of the observed value; the cap is ``max_<key>``."""



@dataclass(frozen=True, slots=True)
class Health:
    """A stopped run's health: the state, why, and what the operator should do."""

    state: HealthState
    """The health state (first matching row of the priority table)."""
    reason: str
    """Why this state, in words, naming the recorded facts that decided it."""
    advice: str | None = None
    """A specific operator action that replaces the state's generic one, when the facts call
    for it (a run that went on after its stop: use the integration that ends the run)."""

    @property
    def action(self) -> str:
        """What the operator should do: :attr:`advice`, else the action for :attr:`state`."""
        return self.advice if self.advice is not None else self.state.operator_action

    def to_dict(self) -> dict[str, str]:
        """``{"state", "reason", "action"}`` as strings."""
        return {"state": self.state.value, "reason": self.reason, "action": self.action}


def classify(receipt: StopReceipt, *, now: float | None = None) -> Health:
    """Classify a stop receipt into a :class:`Health`, applying the priority table.

    Args:
        receipt: the run's stop receipt.
        now: the current time on the receipt's clock; when given, a routed approval whose
            deadline has passed is ``WAITING_UNROUTED`` (nobody acted in time).

    Returns:
        The first matching state; see the module docstring for the table.

    Raises:
        ConfigError: ``receipt`` is not a :class:`StopReceipt` (``StopReceipt.from_dict`` reads
            one from JSON), or ``now`` is not a number.
    """
    if not isinstance(receipt, StopReceipt):
        raise ConfigError("receipt", type(receipt).__name__, "a StopReceipt (StopReceipt.from_dict reads JSON)")
    if now is not None and (isinstance(now, bool) or not isinstance(now, (int, float))):
        raise ConfigError("now", now, "a number of seconds, or None")
    end, reason, failure = receipt.end, receipt.reason, receipt.tool_failure
    went_on = _went_on(receipt.after_stop)
    # Row 1 outranks everything, disagreement included: after a tool failure the safe move is
    # to diagnose the boundary, not to guess whether the side effect happened.
    if end is EndKind.TOOL_FAILURE or reason is StopReason.TOOL_ERROR or failure is not None:
        if failure is not None:
            where = f" (call {failure.call_index})" if failure.call_index is not None else ""
            return Health(
                HealthState.FAILED,
                f"tool {failure.tool} failed with {failure.error_type}{where}"
                + (f"; {went_on}" if went_on else ""),
            )
        return Health(
            HealthState.FAILED,
            "a tool execution failed and ended the run" + (f"; {went_on}" if went_on else ""),
        )
    # A stop that did not end the run is no stop: whatever the recorded cause says, the run
    # went on, so nothing about how it ended can be trusted.
    if went_on:
        return Health(HealthState.UNCERTAIN, f"signals disagree: {went_on}", advice=_GO_ON_ACTION)
    if end is None and reason is None:
        return Health(HealthState.UNCERTAIN, "no stop cause was recorded")

    if reason is not None and reason not in _REASON_FAMILY:
        return Health(HealthState.UNCERTAIN, f"stop reason {reason.value} has no known meaning")
    if end is not None and reason is not None and _REASON_FAMILY[reason] not in _END_FAMILIES[end]:
        return Health(
            HealthState.UNCERTAIN,
            f"signals disagree: the loop ended with {end.value} but the stop reason is "
            f"{reason.value}",
        )
    if reason is not None:
        family = _REASON_FAMILY[reason]
    else:
        assert end is not None  # both None returned above
        family = _END_DEFAULT_FAMILY[end]
    if receipt.approval is not None and family is not _Family.APPROVAL:
        return Health(
            HealthState.UNCERTAIN,
            f"signals disagree: an approval is recorded but the run ended as {family.value}",
        )
    if reason is not None and reason in _REASON_COUNTER:
        key = _REASON_COUNTER[reason]
        seen, cap = receipt.condition.get(key), receipt.condition.get(f"max_{key}")
        if _is_number(seen) and _is_number(cap) and float(seen) < float(cap):  # type: ignore[arg-type]
            return Health(
                HealthState.UNCERTAIN,
                f"signals disagree: stop reason {reason.value} but the recorded inputs show "
                f"{key}={seen} below max_{key}={cap}",
            )

    if family is _Family.APPROVAL:
        return _classify_approval(receipt.approval, now)
    if family is _Family.TIME:
        if receipt.verdict is Verdict.WORKING:
            return Health(
                HealthState.BOUNDED_STOP,
                f"the time bound fired while the run was making progress{_inputs(receipt)}",
            )
        verdict = receipt.verdict.value if receipt.verdict is not None else "none recorded"
        return Health(
            HealthState.STUCK,
            f"timed out with no valid progress (last verdict: {verdict}){_inputs(receipt)}",
        )
    if family is _Family.LOOP:
        return Health(
            HealthState.STUCK,
            f"stopped by {reason.value if reason else 'the loop detector'}: repetition without "
            f"progress{_inputs(receipt)}",
        )
    if family is _Family.ABORT:
        return Health(HealthState.BOUNDED_STOP, "a user or operator aborted the run")
    if family is _Family.BOUND:
        what = reason.value if reason is not None else "a stop condition"
        return Health(HealthState.BOUNDED_STOP, f"{what} fired{_inputs(receipt)}")
    return _classify_done(receipt)


_GO_ON_ACTION: Final = (
    "use the framework integration that ends the run (the framework swallowed the stop); "
    "check what ran after it before acting"
)


def _went_on(after: AfterStop | None) -> str:
    if after is None or not after.active:
        return ""
    return (
        f"the run went on after the stop ({after.model_calls} model call(s), "
        f"{after.tool_calls} tool call(s))"
    )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _inputs(receipt: StopReceipt) -> str:
    if not receipt.condition:
        return ""
    return " (" + ", ".join(f"{k}={v}" for k, v in receipt.condition.items()) + ")"


def _classify_approval(approval: Approval | None, now: float | None) -> Health:
    if approval is None:
        return Health(
            HealthState.WAITING_UNROUTED,
            "approval requested, but no owner, deadline or resume token was recorded",
        )
    if not approval.routed:
        return Health(
            HealthState.WAITING_UNROUTED,
            f"approval requested without {', '.join(approval.missing)}",
        )
    assert approval.deadline_s is not None  # routed implies it
    if now is not None and now >= approval.deadline_s:
        return Health(
            HealthState.WAITING_UNROUTED,
            f"approval from {approval.owner} is past its deadline ({approval.deadline_s})",
        )
    return Health(
        HealthState.WAITING,
        f"waiting for approval from {approval.owner} by {approval.deadline_s}",
    )


def _classify_done(receipt: StopReceipt) -> Health:
    how = receipt.end.value if receipt.end is not None else "completed"
    usable = [o for o in receipt.outcomes if o.checked_by != receipt.agent]
    ignored = len(receipt.outcomes) - len(usable)
    independent = [o for o in usable if o.evidence is Evidence.INDEPENDENT]
    judges = [o for o in usable if o.evidence is Evidence.JUDGE]
    failed = [o for o in independent if not o.passed]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more check(s) failed)" if len(failed) > 1 else ""
        return Health(
            HealthState.FALSE_COMPLETE,
            f"{how}, but the {first.kind.value} check of {first.target} failed: "
            f"{first.failure}{more}",
        )
    judge_pass = any(o.passed for o in judges)
    judge_fail = any(not o.passed for o in judges)
    if independent:
        if judge_fail:
            return Health(
                HealthState.UNCERTAIN,
                f"signals disagree: {len(independent)} independent check(s) passed but an "
                "LLM judge says the task was not done",
            )
        return Health(
            HealthState.VERIFIED_COMPLETE,
            f"{how}; {len(independent)} independent check(s) passed",
        )
    if judge_pass and judge_fail:
        return Health(HealthState.UNCERTAIN, "signals disagree: LLM judges gave opposite verdicts")
    if judge_fail:
        verdict = next(o for o in judges if not o.passed)
        return Health(
            HealthState.FALSE_COMPLETE,
            f"{how}, but the LLM judge says the task was not done ({verdict.failure})",
        )
    if judge_pass:
        if receipt.requires_outcome is OutcomeRequirement.INDEPENDENT:
            return Health(
                HealthState.FALSE_COMPLETE,
                f"{how}; only an LLM judge passed, and this agent's policy requires an "
                "independent check",
            )
        return Health(
            HealthState.VERIFIED_COMPLETE, f"{how}; verified by an LLM judge only (judge evidence)"
        )
    note = f" ({ignored} self-reported receipt(s) ignored)" if ignored else ""
    if receipt.requires_outcome is OutcomeRequirement.NONE:
        return Health(
            HealthState.COMPLETE_UNVERIFIED,
            f"{how}; this agent's policy requires no outcome receipt{note}",
        )
    return Health(HealthState.FALSE_COMPLETE, f"{how} without an outcome receipt{note}")
