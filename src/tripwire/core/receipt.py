"""Stop receipts: why a run stopped, with the inputs of the condition that fired, and its health.

An agent loop that returned is not a run that succeeded. The integration boundary (the guard,
a framework callback, a span processor) records *how* the loop ended as an :class:`EndKind`
taken from the control flow, never guessed from the final text, together with the
:class:`~tripwire.core.reasons.StopReason`, the inputs of the condition that fired, counters,
the loop verdict and any :class:`OutcomeReceipt` from an independent check of the
destination. :func:`classify` turns that :class:`StopReceipt` into a :class:`Health`: one
:class:`HealthState` plus the operator action it calls for.

Priority, first match wins (see ``docs/receipts.md``):

===================================================  =======================
evidence                                             state
===================================================  =======================
a tool execution failed                              ``FAILED``
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
the agent under review (``checked_by == agent``) does not count at all. A model that wrote
``{"status": "done"}`` produced text, not a receipt: :meth:`OutcomeReceipt.from_dict` rejects
it.

Pure and stdlib-only: time comes in as arguments.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, TypeVar

from tripwire.core.reasons import StopReason, Verdict
from tripwire.errors import ConfigError, InputError

__all__ = [
    "SCHEMA",
    "AfterStop",
    "AnyOf",
    "Approval",
    "CalledTool",
    "CompletedStep",
    "Counters",
    "EndKind",
    "Evidence",
    "Health",
    "HealthState",
    "OutcomeReceipt",
    "OutcomeRequirement",
    "Scalar",
    "StepCap",
    "StopCause",
    "StopCondition",
    "StopReceipt",
    "ToolFailure",
    "VerifierKind",
    "classify",
]

SCHEMA: Final = "tripwire.stop_receipt/1"
"""The ``schema`` value of receipts this version writes and reads. Bump on breaking changes."""

Scalar = str | int | float | bool | None
"""A JSON scalar: the only values allowed in ``condition`` and ``observed`` mappings."""

_MAX_SCALAR_KEYS: Final = 64
_MAX_TEXT: Final = 2000


# --------------------------------------------------------------------------------------------
# Vocabularies


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


class EndKind(str, Enum):
    """How the agent loop ended, as the integration boundary saw it in the control flow.

    Recorded where the loop returns or raises, never inferred from the final text.
    """

    NATURAL_FINISH = "natural_finish"
    """The model answered without requesting a tool call."""
    EXPLICIT_DONE = "explicit_done"
    """The model called a tool that means "done" (a final-answer tool, a stop-at-tool)."""
    APPROVAL_REQUESTED = "approval_requested"
    """The run paused for a human (or system) approval."""
    STOP_CONDITION = "stop_condition"
    """A configured condition fired: a step, token, cost or time cap, or the loop detector."""
    USER_ABORT = "user_abort"
    """A user or operator cancelled the run."""
    TIMEOUT = "timeout"
    """A wall-clock deadline cut the run off (run deadline, or a tool call that timed out)."""
    TOOL_FAILURE = "tool_failure"
    """A tool execution failed and the loop ended because of it."""


class OutcomeRequirement(str, Enum):
    """Per-agent policy: what a finished run needs before it counts as verified."""

    NONE = "none"
    """No outcome receipt is required (e.g. a research answer): a finish without one is
    ``COMPLETE_UNVERIFIED``. A receipt that is given still counts, and a failing one still
    makes the run ``FALSE_COMPLETE``."""
    ANY = "any"
    """A passing receipt is required; an independent check or an LLM judge both qualify."""
    INDEPENDENT = "independent"
    """A passing independent (deterministic) check is required; an LLM judge alone is not
    enough (e.g. a workflow that must write a file)."""


class VerifierKind(str, Enum):
    """What kind of check produced an outcome receipt."""

    FILE = "file"
    SQL = "sql"
    HTTP = "http"
    MESSAGE = "message"
    CUSTOM = "custom"
    LLM_JUDGE = "llm_judge"


class Evidence(str, Enum):
    """How strong an outcome receipt is as evidence."""

    INDEPENDENT = "independent"
    """A deterministic check of the destination itself (file, row, URL, provider id)."""
    JUDGE = "judge"
    """An LLM's opinion of whether the task was done: evidence of its own, weaker kind."""


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


# --------------------------------------------------------------------------------------------
# Validation helpers (shared by constructors and by ``from_dict``)


def _check_scalars(name: str, values: Mapping[str, Any]) -> dict[str, Scalar]:
    if not isinstance(values, Mapping):
        raise ConfigError(name, values, "a mapping of str to JSON scalars")
    if len(values) > _MAX_SCALAR_KEYS:
        raise ConfigError(name, f"<{len(values)} keys>", f"at most {_MAX_SCALAR_KEYS} keys")
    out: dict[str, Scalar] = {}
    for key in sorted(values):
        value = values[key]
        if not isinstance(key, str):
            raise ConfigError(name, key, "str keys")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name}[{key!r}]", value, "a finite number")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"{name}[{key!r}]", type(value).__name__, "a str, int, float, bool or None"
            )
        if isinstance(value, str) and len(value) > _MAX_TEXT:
            raise ConfigError(f"{name}[{key!r}]", f"<{len(value)} chars>", "a short string")
        out[key] = value
    return out


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(name, value, "an integer >= 0")


def _check_seconds(name: str, value: Any, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, value, "a finite number of seconds")
    return float(value)


def _check_nonneg(name: str, value: Any) -> float | None:
    out = _check_seconds(name, value)
    if out is not None and out < 0:
        raise ConfigError(name, value, "a finite number >= 0")
    return out


# --------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, slots=True, kw_only=True)
class Counters:
    """What the run consumed, as counted at the boundary when it stopped."""

    steps: int = 0
    """Completed steps (model turns). A run stopped by a 20-step cap shows exactly 20."""
    tool_calls: int = 0
    """Tool calls started."""
    input_tokens: int = 0
    """Prompt tokens over all model calls."""
    output_tokens: int = 0
    """Completion tokens over all model calls."""
    cost_usd: float | None = None
    """Estimated cost in USD; ``None`` when no price was known (not the same as 0)."""
    duration_s: float | None = None
    """Wall-clock duration in seconds; ``None`` when not measured."""

    def __post_init__(self) -> None:
        for name in ("steps", "tool_calls", "input_tokens", "output_tokens"):
            _check_count(f"Counters.{name}", getattr(self, name))
        object.__setattr__(self, "cost_usd", _check_nonneg("Counters.cost_usd", self.cost_usd))
        object.__setattr__(
            self, "duration_s", _check_nonneg("Counters.duration_s", self.duration_s)
        )

    def to_dict(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        return {
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "duration_s": self.duration_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class AfterStop:
    """Activity seen after the run was stopped: the framework swallowed the stop and went on.

    Filled in by the integration that raised the stop (the guard, a framework adapter) from
    what it saw afterwards. Any activity means the stop did not end the run, so
    :func:`classify` never reports such a run as a clean stop.
    """

    model_calls: int = 0
    """Model calls made after the stop."""
    tool_calls: int = 0
    """Tool calls attempted after the stop (refused or not: the agent went on)."""

    def __post_init__(self) -> None:
        _check_count("AfterStop.model_calls", self.model_calls)
        _check_count("AfterStop.tool_calls", self.tool_calls)

    @property
    def active(self) -> bool:
        """True when anything happened after the stop."""
        return self.model_calls > 0 or self.tool_calls > 0

    def to_dict(self) -> dict[str, Any]:
        """The activity as a JSON-ready dict."""
        return {"model_calls": self.model_calls, "tool_calls": self.tool_calls}


@dataclass(frozen=True, slots=True, kw_only=True)
class Approval:
    """An approval the run is waiting for, and how the decision is routed.

    It is *routed* only when all three of ``owner``, ``deadline_s`` and ``resume_token`` are
    present; a request missing any of them is ``WAITING_UNROUTED``.
    """

    owner: str | None = None
    """Who must decide (a person, a team, a queue)."""
    deadline_s: float | None = None
    """When the decision is due: absolute seconds, on the same clock as ``started_at``."""
    resume_token: str | None = None
    """The handle that resumes the paused run (a checkpoint or thread id); not a secret."""

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "deadline_s", _check_seconds("Approval.deadline_s", self.deadline_s)
        )
        for name in ("owner", "resume_token"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"Approval.{name}", value, "a str or None")

    @property
    def missing(self) -> tuple[str, ...]:
        """The routing fields that are absent or empty, in declaration order."""
        return tuple(
            name
            for name, value in (
                ("owner", self.owner),
                ("deadline_s", self.deadline_s),
                ("resume_token", self.resume_token),
            )
            if value is None or value == ""
        )

    @property
    def routed(self) -> bool:
        """True when owner, deadline and resume token are all present."""
        return not self.missing

    def to_dict(self) -> dict[str, Any]:
        """The approval as a JSON-ready dict."""
        return {
            "owner": self.owner,
            "deadline_s": self.deadline_s,
            "resume_token": self.resume_token,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolFailure:
    """The tool execution failure that ended the run. Names only: no arguments, no payloads."""

    tool: str
    """The tool's name."""
    error_type: str
    """The error class (``"TimeoutError"``, ``"HTTP 503"``), never the error's raw text."""
    call_index: int | None = None
    """1-based index of the failed call in the run, if known."""
    side_effect_uncertain: bool = True
    """Whether the call may have had a side effect before failing (the safe default: yes)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or not self.tool:
            raise ConfigError("ToolFailure.tool", self.tool, "a non-empty tool name")
        if not isinstance(self.error_type, str):
            raise ConfigError("ToolFailure.error_type", self.error_type, "a str")
        if self.call_index is not None:
            _check_count("ToolFailure.call_index", self.call_index)
        if not isinstance(self.side_effect_uncertain, bool):
            raise ConfigError(
                "ToolFailure.side_effect_uncertain", self.side_effect_uncertain, "a bool"
            )

    def to_dict(self) -> dict[str, Any]:
        """The failure as a JSON-ready dict."""
        return {
            "tool": self.tool,
            "error_type": self.error_type,
            "call_index": self.call_index,
            "side_effect_uncertain": self.side_effect_uncertain,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeReceipt:
    """The result of one check of the run's destination (a file, a row, a URL, a message id).

    Built by :mod:`tripwire.verify`, or by hand for checks tripwire does not ship. Never a
    model's own claim: a receipt whose ``checked_by`` is the agent under review is ignored by
    :func:`classify`.
    """

    kind: VerifierKind
    """Which kind of verifier produced it."""
    target: str
    """What was checked, without secrets (path, masked DB URL + query, URL without query)."""
    checked_at: float
    """When the check ran (seconds, passed in by the caller's clock)."""
    passed: bool
    """Whether the destination matched every expectation. ``False`` on any error."""
    checked_by: str
    """Who made the check: ``"tripwire.verify.file"``, ``"llm_judge:<model>"``, a service."""
    evidence: Evidence = Evidence.INDEPENDENT
    """Independent check or LLM judge. An ``llm_judge`` receipt is always ``JUDGE``."""
    observed: Mapping[str, Scalar] = field(default_factory=dict)
    """What the check saw (size, status, row fields...): a few JSON scalars."""
    expected: Mapping[str, Scalar] = field(default_factory=dict)
    """What the check required, same keys as ``observed`` where they compare."""
    error: str | None = None
    """Why the check could not finish (timeout, unreachable, missing extra), if it could not."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, VerifierKind):
            raise ConfigError("OutcomeReceipt.kind", self.kind, "a VerifierKind")
        if not isinstance(self.evidence, Evidence):
            raise ConfigError("OutcomeReceipt.evidence", self.evidence, "an Evidence")
        if self.kind is VerifierKind.LLM_JUDGE and self.evidence is not Evidence.JUDGE:
            raise ConfigError(
                "OutcomeReceipt.evidence", self.evidence.value, "'judge' for an llm_judge receipt"
            )
        if not isinstance(self.target, str) or not self.target:
            raise ConfigError("OutcomeReceipt.target", self.target, "a non-empty description")
        if not isinstance(self.checked_by, str) or not self.checked_by:
            raise ConfigError("OutcomeReceipt.checked_by", self.checked_by, "a non-empty name")
        object.__setattr__(
            self,
            "checked_at",
            _check_seconds("OutcomeReceipt.checked_at", self.checked_at, optional=False),
        )
        if not isinstance(self.passed, bool):
            raise ConfigError("OutcomeReceipt.passed", self.passed, "a bool")
        if self.error is not None and not isinstance(self.error, str):
            raise ConfigError("OutcomeReceipt.error", self.error, "a str or None")
        if self.passed and self.error is not None:
            raise ConfigError("OutcomeReceipt.error", self.error, "None when passed is True")
        object.__setattr__(
            self, "observed", _check_scalars("OutcomeReceipt.observed", self.observed)
        )
        object.__setattr__(
            self, "expected", _check_scalars("OutcomeReceipt.expected", self.expected)
        )

    def to_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict."""
        return {
            "kind": self.kind.value,
            "target": self.target,
            "checked_at": self.checked_at,
            "passed": self.passed,
            "checked_by": self.checked_by,
            "evidence": self.evidence.value,
            "observed": dict(self.observed),
            "expected": dict(self.expected),
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<outcome>") -> OutcomeReceipt:
        """Rebuild a receipt from :meth:`to_dict` output.

        Raises:
            InputError: naming ``source`` and the field, when ``data`` is not a receipt (a
                model's ``{"status": "done"}`` is not one).
        """
        return _outcome_from(_Reader(data, source, ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class StopReceipt:
    """Why one run stopped, recorded at the integration boundary. No prompts, no payloads.

    Round-trips exactly through :meth:`to_json` / :meth:`from_json`; the ``schema`` field
    versions the format.
    """

    run_id: str
    """The run (trace) id."""
    agent: str
    """The agent's name; also the identity whose self-checks never count as receipts."""
    end: EndKind | None
    """How the loop ended, from the control flow; ``None`` when the boundary did not see it."""
    reason: StopReason | None
    """The stop reason (which condition fired); ``None`` when none was recorded."""
    condition: Mapping[str, Scalar] = field(default_factory=dict)
    """Inputs of the condition that fired, e.g. ``{"steps": 20, "max_steps": 20}``: the
    observed value under the counter's name and the configured cap under ``max_<name>``."""
    policy_version: str | None = None
    """Version of the loop/budget policy in force."""
    normalizer_version: str | None = None
    """Version of the signature normalizer, so a normalizer change is not read as recovery."""
    counters: Counters = field(default_factory=Counters)
    """Steps, tool calls, tokens, cost and duration at the stop."""
    verdict: Verdict | None = None
    """The last loop verdict; for a timeout it tells valid progress (``working``) from none."""
    approval: Approval | None = None
    """The pending approval and its routing, when the run paused for one."""
    outcomes: tuple[OutcomeReceipt, ...] = ()
    """Outcome receipts from checks of the destination, in the order they ran."""
    requires_outcome: OutcomeRequirement = OutcomeRequirement.ANY
    """The agent's policy: what a finished run needs to count as verified."""
    tool_failure: ToolFailure | None = None
    """The tool failure that ended the run, if one did."""
    started_at: float | None = None
    """When the run started (seconds, caller's clock)."""
    ended_at: float | None = None
    """When the run stopped (seconds, same clock)."""
    after_stop: AfterStop | None = None
    """Activity after the stop (a framework swallowed it and went on); ``None`` = not watched."""
    schema: str = SCHEMA
    """The receipt format version; always :data:`SCHEMA` for receipts built by this code."""

    def __post_init__(self) -> None:
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ConfigError("StopReceipt.run_id", self.run_id, "a non-empty str")
        if not isinstance(self.agent, str) or not self.agent:
            raise ConfigError("StopReceipt.agent", self.agent, "a non-empty agent name")
        if self.end is not None and not isinstance(self.end, EndKind):
            raise ConfigError("StopReceipt.end", self.end, "an EndKind or None")
        if self.reason is not None and not isinstance(self.reason, StopReason):
            raise ConfigError("StopReceipt.reason", self.reason, "a StopReason or None")
        if self.verdict is not None and not isinstance(self.verdict, Verdict):
            raise ConfigError("StopReceipt.verdict", self.verdict, "a Verdict or None")
        if not isinstance(self.requires_outcome, OutcomeRequirement):
            raise ConfigError(
                "StopReceipt.requires_outcome", self.requires_outcome, "an OutcomeRequirement"
            )
        if not isinstance(self.counters, Counters):
            raise ConfigError("StopReceipt.counters", self.counters, "a Counters")
        if self.approval is not None and not isinstance(self.approval, Approval):
            raise ConfigError("StopReceipt.approval", self.approval, "an Approval or None")
        if self.tool_failure is not None and not isinstance(self.tool_failure, ToolFailure):
            raise ConfigError(
                "StopReceipt.tool_failure", self.tool_failure, "a ToolFailure or None"
            )
        if self.after_stop is not None and not isinstance(self.after_stop, AfterStop):
            raise ConfigError("StopReceipt.after_stop", self.after_stop, "an AfterStop or None")
        for name in ("policy_version", "normalizer_version"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"StopReceipt.{name}", value, "a str or None")
        if self.schema != SCHEMA:
            raise ConfigError("StopReceipt.schema", self.schema, repr(SCHEMA))
        outcomes = tuple(self.outcomes)
        for item in outcomes:
            if not isinstance(item, OutcomeReceipt):
                raise ConfigError(
                    "StopReceipt.outcomes", type(item).__name__, "OutcomeReceipt values"
                )
        object.__setattr__(self, "outcomes", outcomes)
        object.__setattr__(
            self, "condition", _check_scalars("StopReceipt.condition", self.condition)
        )
        started = _check_seconds("StopReceipt.started_at", self.started_at)
        ended = _check_seconds("StopReceipt.ended_at", self.ended_at)
        if started is not None and ended is not None and ended < started:
            raise ConfigError("StopReceipt.ended_at", ended, f"a time >= started_at ({started})")
        object.__setattr__(self, "started_at", started)
        object.__setattr__(self, "ended_at", ended)

    def to_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict (enums as their values, tuples as lists)."""
        return {
            "schema": self.schema,
            "run_id": self.run_id,
            "agent": self.agent,
            "end": None if self.end is None else self.end.value,
            "reason": None if self.reason is None else self.reason.value,
            "condition": dict(self.condition),
            "policy_version": self.policy_version,
            "normalizer_version": self.normalizer_version,
            "counters": self.counters.to_dict(),
            "verdict": None if self.verdict is None else self.verdict.value,
            "approval": None if self.approval is None else self.approval.to_dict(),
            "outcomes": [o.to_dict() for o in self.outcomes],
            "requires_outcome": self.requires_outcome.value,
            "tool_failure": None if self.tool_failure is None else self.tool_failure.to_dict(),
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "after_stop": None if self.after_stop is None else self.after_stop.to_dict(),
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """The receipt as JSON text; ``from_json(r.to_json()) == r`` for every receipt."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, ensure_ascii=False)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<receipt>") -> StopReceipt:
        """Rebuild a receipt from :meth:`to_dict` output, validating every field.

        Raises:
            InputError: naming ``source`` and the offending field (unknown keys, wrong types,
                an unsupported ``schema``).
        """
        return _receipt_from(_Reader(data, source, ""))

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "<receipt>") -> StopReceipt:
        """Parse JSON text into a receipt.

        Raises:
            InputError: naming ``source`` (and the line) for invalid JSON, and the field for
                an invalid receipt.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(
                source, f"not valid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
            ) from None
        except UnicodeDecodeError:
            raise InputError(source, "not valid UTF-8 text") from None
        return cls.from_dict(data, source=source)


# --------------------------------------------------------------------------------------------
# Decoding


_T = TypeVar("_T")
_E = TypeVar("_E", bound=Enum)


class _Reader:
    """Reads typed fields from a decoded JSON object, naming the field path in errors."""

    __slots__ = ("data", "path", "seen", "source")

    def __init__(self, data: Any, source: str, path: str) -> None:
        self.source = source
        self.path = path
        if not isinstance(data, dict):
            raise InputError(
                source, f"{self._where()}expected a JSON object, got {_json_type(data)}"
            )
        self.data: dict[str, Any] = data
        self.seen: set[str] = set()

    def _where(self, key: str | None = None) -> str:
        full = ".".join(p for p in (self.path, key) if p)
        return f"field '{full}': " if full else ""

    def fail(self, key: str, detail: str) -> InputError:
        return InputError(self.source, f"{self._where(key)}{detail}")

    def raw(self, key: str, *, required: bool = True, default: Any = None) -> Any:
        self.seen.add(key)
        if key not in self.data:
            if required:
                raise self.fail(key, "missing")
            return default
        return self.data[key]

    def text(self, key: str, *, optional: bool = False, required: bool = True) -> Any:
        value = self.raw(key, required=required)
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_json_type(value)}")
        return value

    def enum(
        self,
        key: str,
        cls: type[_E],
        *,
        optional: bool = False,
        required: bool = True,
        default: Any = None,
    ) -> Any:
        value = self.raw(key, required=required, default=default)
        if value is None and optional:
            return None
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in cls)
            raise self.fail(key, f"expected one of {allowed}, got {value!r}") from None

    def child(self, key: str, *, optional: bool = False) -> _Reader | None:
        value = self.raw(key, required=not optional)
        if value is None and optional:
            return None
        return _Reader(value, self.source, ".".join(p for p in (self.path, key) if p))

    def items(self, key: str) -> list[Any]:
        value = self.raw(key, required=False, default=[])
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {_json_type(value)}")
        return value

    def build(self, key: str, fn: Callable[[], _T]) -> _T:
        """Run a constructor, turning its ConfigError into an InputError on ``key``."""
        try:
            return fn()
        except ConfigError as exc:
            field_name = exc.field.rsplit(".", 1)[-1].split("[", 1)[0]
            raise self.fail(
                key or field_name, f"{exc.expected} expected, got {exc.value!r}"
            ) from None

    def done(self) -> None:
        extra = sorted(set(self.data) - self.seen)
        if extra:
            raise self.fail(extra[0], "unknown field")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _counters_from(r: _Reader) -> Counters:
    values = {
        name: r.raw(name, required=False, default=default)
        for name, default in (
            ("steps", 0),
            ("tool_calls", 0),
            ("input_tokens", 0),
            ("output_tokens", 0),
            ("cost_usd", None),
            ("duration_s", None),
        )
    }
    r.done()
    for name, value in values.items():
        try:
            Counters(**{name: value})
        except ConfigError as exc:
            raise r.fail(name, f"expected {exc.expected}, got {value!r}") from None
    return Counters(**values)


def _scalars_from(r: _Reader, key: str) -> dict[str, Scalar]:
    value = r.raw(key, required=False, default={})
    if not isinstance(value, dict):
        raise r.fail(key, f"expected an object of scalars, got {_json_type(value)}")
    try:
        return _check_scalars(key, value)
    except ConfigError as exc:
        raise r.fail(exc.field, f"expected {exc.expected}, got {exc.value!r}") from None


def _outcome_from(r: _Reader) -> OutcomeReceipt:
    kind = r.enum("kind", VerifierKind)
    target = r.text("target")
    checked_at = r.raw("checked_at")
    passed = r.raw("passed")
    if not isinstance(passed, bool):
        raise r.fail("passed", f"expected a boolean, got {_json_type(passed)}")
    checked_by = r.text("checked_by")
    evidence = r.enum("evidence", Evidence)
    observed = _scalars_from(r, "observed")
    expected = _scalars_from(r, "expected")
    error = r.text("error", optional=True, required=False)
    r.done()
    fields: dict[str, Any] = {
        "kind": kind,
        "target": target,
        "checked_at": checked_at,
        "passed": passed,
        "checked_by": checked_by,
        "evidence": evidence,
        "observed": observed,
        "expected": expected,
        "error": error,
    }
    try:
        return OutcomeReceipt(**fields)
    except ConfigError as exc:
        name = exc.field.split(".", 1)[-1]
        raise r.fail(name, f"expected {exc.expected}, got {exc.value!r}") from None


def _receipt_from(r: _Reader) -> StopReceipt:
    schema = r.text("schema")
    if schema != SCHEMA:
        raise r.fail(
            "schema", f"unsupported receipt schema {schema!r}; this tripwire reads {SCHEMA!r}"
        )
    counters_reader = r.child("counters", optional=True)
    counters = Counters() if counters_reader is None else _counters_from(counters_reader)
    approval_reader = r.child("approval", optional=True)
    approval = None
    if approval_reader is not None:
        owner = approval_reader.text("owner", optional=True, required=False)
        deadline = approval_reader.raw("deadline_s", required=False)
        token = approval_reader.text("resume_token", optional=True, required=False)
        approval_reader.done()
        approval = approval_reader.build(
            "deadline_s",
            lambda: Approval(owner=owner, deadline_s=deadline, resume_token=token),
        )
    failure_reader = r.child("tool_failure", optional=True)
    failure = None
    if failure_reader is not None:
        f = failure_reader
        tool = f.text("tool")
        error_type = f.text("error_type")
        call_index = f.raw("call_index", required=False)
        uncertain = f.raw("side_effect_uncertain", required=False, default=True)
        f.done()
        failure = f.build(
            "",
            lambda: ToolFailure(
                tool=tool,
                error_type=error_type,
                call_index=call_index,
                side_effect_uncertain=uncertain,
            ),
        )
    after_reader = r.child("after_stop", optional=True)
    after_stop = None
    if after_reader is not None:
        a = after_reader
        model_calls = a.raw("model_calls", required=False, default=0)
        tool_calls = a.raw("tool_calls", required=False, default=0)
        a.done()
        after_stop = a.build(
            "", lambda: AfterStop(model_calls=model_calls, tool_calls=tool_calls)
        )
    outcomes = tuple(
        _outcome_from(_Reader(item, r.source, f"outcomes[{i}]"))
        for i, item in enumerate(r.items("outcomes"))
    )
    fields: dict[str, Any] = {
        "schema": schema,
        "run_id": r.text("run_id"),
        "agent": r.text("agent"),
        "end": r.enum("end", EndKind, optional=True),
        "reason": r.enum("reason", StopReason, optional=True),
        "condition": _scalars_from(r, "condition"),
        "policy_version": r.text("policy_version", optional=True, required=False),
        "normalizer_version": r.text("normalizer_version", optional=True, required=False),
        "counters": counters,
        "verdict": r.enum("verdict", Verdict, optional=True, required=False),
        "approval": approval,
        "outcomes": outcomes,
        "requires_outcome": r.enum(
            "requires_outcome",
            OutcomeRequirement,
            required=False,
            default=OutcomeRequirement.ANY.value,
        ),
        "tool_failure": failure,
        "started_at": r.raw("started_at", required=False),
        "ended_at": r.raw("ended_at", required=False),
        "after_stop": after_stop,
    }
    r.done()
    try:
        return StopReceipt(**fields)
    except ConfigError as exc:
        name = exc.field.split(".", 1)[-1]
        raise r.fail(name, f"expected {exc.expected}, got {exc.value!r}") from None


# --------------------------------------------------------------------------------------------
# Stop conditions


@dataclass(frozen=True, slots=True)
class CompletedStep:
    """One completed step (model turn) as stop conditions see it: the tools it called."""

    tools: tuple[str, ...] = ()
    """Names of the tools this step called, in order (empty: the model answered in text)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopCause:
    """What a stop condition decided, with its inputs; copy the fields into the receipt."""

    end: EndKind
    """The control-flow end this condition produces."""
    reason: StopReason
    """The stop reason to record."""
    condition: Mapping[str, Scalar]
    """The condition's inputs at the moment it fired."""


class StopCondition:
    """Base of the stop conditions: ``cond(steps) -> StopCause | None``; combine with ``|``.

    Conditions are stateless. Evaluate them after every completed step over all completed
    steps so far (a tuple of :class:`CompletedStep`).
    """

    __slots__ = ()

    def __call__(self, steps: Sequence[CompletedStep]) -> StopCause | None:
        raise NotImplementedError

    def __or__(self, other: StopCondition) -> AnyOf:
        return AnyOf(self, other)


class AnyOf(StopCondition):
    """Fires with the cause of the first member that fires (in the order given)."""

    __slots__ = ("conditions",)

    def __init__(self, *conditions: StopCondition) -> None:
        flat: list[StopCondition] = []
        for cond in conditions:
            if isinstance(cond, AnyOf):
                flat.extend(cond.conditions)
            elif isinstance(cond, StopCondition):
                flat.append(cond)
            else:
                raise ConfigError("AnyOf.conditions", type(cond).__name__, "StopCondition values")
        self.conditions: tuple[StopCondition, ...] = tuple(flat)

    def __call__(self, steps: Sequence[CompletedStep]) -> StopCause | None:
        for cond in self.conditions:
            cause = cond(steps)
            if cause is not None:
                return cause
        return None

    def __repr__(self) -> str:
        return " | ".join(repr(c) for c in self.conditions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyOf) and self.conditions == other.conditions

    def __hash__(self) -> int:
        return hash(self.conditions)


class StepCap(StopCondition):
    """A step cap of ``n``: fires when the number of completed steps reaches ``n``.

    Check it after every completed step: it fires exactly when the count becomes ``n``, so the
    run stops with ``n`` steps and the receipt records ``{"steps": n, "max_steps": n}``.
    The trap: checking only now and then turns "reaches n" into "at least n, observed later";
    if that happens the condition still fires, and records the true (larger) count rather than
    pretending the run stopped at ``n``.
    """

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("StepCap.n", n, "an integer >= 1")
        self.n = n

    def __call__(self, steps: Sequence[CompletedStep]) -> StopCause | None:
        count = len(steps)
        if count < self.n:
            return None
        return StopCause(
            end=EndKind.STOP_CONDITION,
            reason=StopReason.MAX_STEPS,
            condition={"steps": count, "max_steps": self.n},
        )

    def __repr__(self) -> str:
        return f"StepCap({self.n})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepCap) and other.n == self.n

    def __hash__(self) -> int:
        return hash(("StepCap", self.n))


class CalledTool(StopCondition):
    """Fires when the *last completed step* called tool ``name``; earlier steps don't count.

    The usual use is a "done" tool (a final-answer tool without an executor), so the default
    cause is ``explicit_done`` / ``completed``; pass ``end``/``reason`` for other meanings
    (e.g. an ``escalate`` tool as ``approval_requested`` / ``approval_required``).
    """

    __slots__ = ("end", "name", "reason")

    def __init__(
        self,
        name: str,
        *,
        end: EndKind = EndKind.EXPLICIT_DONE,
        reason: StopReason = StopReason.COMPLETED,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError("CalledTool.name", name, "a non-empty tool name")
        if not isinstance(end, EndKind):
            raise ConfigError("CalledTool.end", end, "an EndKind")
        if not isinstance(reason, StopReason):
            raise ConfigError("CalledTool.reason", reason, "a StopReason")
        self.name = name
        self.end = end
        self.reason = reason

    def __call__(self, steps: Sequence[CompletedStep]) -> StopCause | None:
        if not steps or self.name not in steps[-1].tools:
            return None
        return StopCause(
            end=self.end,
            reason=self.reason,
            condition={"stop_tool": self.name, "step": len(steps)},
        )

    def __repr__(self) -> str:
        return f"CalledTool({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CalledTool) and (other.name, other.end, other.reason) == (
            self.name,
            self.end,
            self.reason,
        )

    def __hash__(self) -> int:
        return hash(("CalledTool", self.name, self.end, self.reason))


# --------------------------------------------------------------------------------------------
# Classification


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
    """
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
        why = f": {first.error}" if first.error else ""
        return Health(
            HealthState.FALSE_COMPLETE,
            f"{how}, but the {first.kind.value} check of {first.target} failed{why}",
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
        return Health(
            HealthState.FALSE_COMPLETE, f"{how}, but the LLM judge says the task was not done"
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
