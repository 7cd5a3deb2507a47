"""Stop receipts: why a run stopped, with the inputs of the condition that fired.

An agent loop that returned is not a run that succeeded. The integration boundary (the guard,
a framework callback, a span processor) records *how* the loop ended as an :class:`EndKind`
taken from the control flow, never guessed from the final text, together with the
:class:`~tripwire.core.reasons.StopReason`, the inputs of the condition that fired, counters,
the loop verdict, any activity after the stop and any :class:`OutcomeReceipt` from an
independent check of the destination. :func:`tripwire.core.health.classify` turns that
:class:`StopReceipt` into a health state (re-exported here with :class:`Health` and
:class:`HealthState`).

Every value is a frozen, keyword-only ``msgspec.Struct``: the constructor validates and raises
:class:`~tripwire.errors.ConfigError` naming the field; reading JSON (or a dict) is one
``msgspec`` decode against these types, and any error comes out as an
:class:`~tripwire.errors.InputError` naming the source and the field path
(``field 'counters.steps': expected an integer >= 0, got -1``). A model that wrote
``{"status": "done"}`` produced text, not a receipt: :meth:`OutcomeReceipt.from_dict`
rejects it.

Pure: time comes in as arguments.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, TypeVar

import msgspec
from msgspec.structs import force_setattr

from tripwire.core.reasons import StopReason, Verdict
from tripwire.errors import ConfigError, InputError

if TYPE_CHECKING:
    from tripwire.core.budget import RunCounters

__all__ = [
    "SCHEMA",
    "AfterStop",
    "Approval",
    "Counters",
    "EndKind",
    "Evidence",
    "Health",
    "HealthState",
    "OutcomeReceipt",
    "OutcomeRequirement",
    "Scalar",
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
_INT_MIN: Final = -(2**63)
_INT_END: Final = 2**64
"""Integers in a receipt fit in 64 bits, so every JSON reader (and this one) reads them back."""


# --------------------------------------------------------------------------------------------
# Vocabularies


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


# --------------------------------------------------------------------------------------------
# Validation helpers (run by the constructors, and so by every decode)


def _short(value: Scalar) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_scalars(name: str, values: Any) -> dict[str, Scalar]:
    if not isinstance(values, Mapping):
        raise ConfigError(name, values, "a mapping of str to JSON scalars")
    if len(values) > _MAX_SCALAR_KEYS:
        raise ConfigError(name, f"<{len(values)} keys>", f"at most {_MAX_SCALAR_KEYS} keys")
    if not all(isinstance(key, str) for key in values):
        bad = next(key for key in values if not isinstance(key, str))
        raise ConfigError(name, bad, "str keys")
    out: dict[str, Scalar] = {}
    for key in sorted(values):
        value = values[key]
        where = f"{name}[{key!r}]"
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(where, value, "a finite number")
        if _is_int(value) and not _INT_MIN <= value < _INT_END:
            raise ConfigError(where, f"<{value.bit_length()}-bit integer>", "a 64-bit integer")
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise ConfigError(where, type(value).__name__, "a str, int, float, bool or None")
        if isinstance(value, str) and len(value) > _MAX_TEXT:
            raise ConfigError(where, f"<{len(value)} chars>", "a short string")
        out[key] = value
    return out


def _check_count(name: str, value: Any) -> None:
    if not _is_int(value) or value < 0:
        raise ConfigError(name, value, "an integer >= 0")
    if value >= _INT_END:
        raise ConfigError(name, f"<{value.bit_length()}-bit integer>", "a 64-bit integer >= 0")


def _check_seconds(name: str, value: Any, *, optional: bool = True) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, value, "a finite number of seconds")
    try:
        out = float(value)
    except OverflowError:
        raise ConfigError(name, "<a huge integer>", "a finite number of seconds") from None
    if not math.isfinite(out):
        raise ConfigError(name, value, "a finite number of seconds")
    return out


def _check_nonneg(name: str, value: Any) -> float | None:
    out = _check_seconds(name, value)
    if out is not None and out < 0:
        raise ConfigError(name, value, "a finite number >= 0")
    return out


def _check_text(name: str, value: Any, expected: str, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str) or (expected.startswith("a non-empty") and not value):
        raise ConfigError(name, value, expected)


class _Value(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the receipt values: frozen, unknown fields rejected on read.

    ``kw_only`` applies per class in msgspec (and type checkers read ``frozen`` per class), so
    each value class sets both again.
    """


# --------------------------------------------------------------------------------------------
# Values


class Counters(_Value, frozen=True, kw_only=True):
    """What the run consumed, as recorded in its receipt when it stopped.

    Not the same value as :class:`tripwire.core.budget.RunCounters`, on purpose: that one is
    the live meter's snapshot that the budget checks read (per-tool counts, the duplicate
    count, the no-progress streak, ``cost_usd`` as a running sum with ``0.0`` for "nothing
    priced yet"); this one is the persisted, versioned record of a finished run, whose JSON
    format is a contract with ``tripwire explain`` and run stores, and in which an unknown
    price is ``None``, not 0. :meth:`from_run` is the one conversion between the two.
    """

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
    unpriced_calls: int = 0
    """Model calls whose price was unknown: ``cost_usd`` undercounts when this is not 0."""

    def __post_init__(self) -> None:
        for name in ("steps", "tool_calls", "input_tokens", "output_tokens", "unpriced_calls"):
            _check_count(f"Counters.{name}", getattr(self, name))
        force_setattr(self, "cost_usd", _check_nonneg("Counters.cost_usd", self.cost_usd))
        force_setattr(self, "duration_s", _check_nonneg("Counters.duration_s", self.duration_s))

    @classmethod
    def from_run(cls, run: RunCounters) -> Counters:
        """The receipt's counters from the budget meter's snapshot.

        ``cost_usd`` is ``None`` when no model call had a known price (only unpriced calls),
        the priced sum otherwise, with ``unpriced_calls`` saying how many were left out;
        ``duration_s`` is the meter's ``elapsed_s``.
        """
        unknown = run.unpriced_calls > 0 and not run.cost_usd
        return cls(
            steps=run.steps,
            tool_calls=run.tool_calls,
            input_tokens=run.input_tokens,
            output_tokens=run.output_tokens,
            cost_usd=None if unknown else run.cost_usd,
            duration_s=run.elapsed_s,
            unpriced_calls=run.unpriced_calls,
        )

    def to_dict(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        return _builtins(self)


class AfterStop(_Value, frozen=True, kw_only=True):
    """Activity seen after the run was stopped: the framework swallowed the stop and went on.

    Filled in by the integration that raised the stop (the guard, a framework adapter) from
    what it saw afterwards. Any activity means the stop did not end the run, so
    :func:`~tripwire.core.health.classify` never reports such a run as a clean stop.
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
        return _builtins(self)


class Approval(_Value, frozen=True, kw_only=True):
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
        force_setattr(self, "deadline_s", _check_seconds("Approval.deadline_s", self.deadline_s))
        _check_text("Approval.owner", self.owner, "a str or None")
        _check_text("Approval.resume_token", self.resume_token, "a str or None")

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
        return _builtins(self)


class ToolFailure(_Value, frozen=True, kw_only=True):
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
        _check_text("ToolFailure.tool", self.tool, "a non-empty tool name", optional=False)
        _check_text("ToolFailure.error_type", self.error_type, "a str", optional=False)
        if self.call_index is not None:
            _check_count("ToolFailure.call_index", self.call_index)
        if not isinstance(self.side_effect_uncertain, bool):
            raise ConfigError(
                "ToolFailure.side_effect_uncertain", self.side_effect_uncertain, "a bool"
            )

    def to_dict(self) -> dict[str, Any]:
        """The failure as a JSON-ready dict."""
        return _builtins(self)


class OutcomeReceipt(_Value, frozen=True, kw_only=True):
    """The result of one check of the run's destination (a file, a row, a URL, a message id).

    Built by :mod:`tripwire.verify`, or by hand for checks tripwire does not ship. Never a
    model's own claim: a receipt whose ``checked_by`` is the agent under review is ignored by
    :func:`~tripwire.core.health.classify`.
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
    observed: Mapping[str, Scalar] = msgspec.field(default_factory=dict)
    """What the check saw (size, status, row fields...): a few JSON scalars."""
    expected: Mapping[str, Scalar] = msgspec.field(default_factory=dict)
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
        _check_text(
            "OutcomeReceipt.target", self.target, "a non-empty description", optional=False
        )
        _check_text(
            "OutcomeReceipt.checked_by", self.checked_by, "a non-empty name", optional=False
        )
        force_setattr(
            self,
            "checked_at",
            _check_seconds("OutcomeReceipt.checked_at", self.checked_at, optional=False),
        )
        if not isinstance(self.passed, bool):
            raise ConfigError("OutcomeReceipt.passed", self.passed, "a bool")
        _check_text("OutcomeReceipt.error", self.error, "a str or None")
        if self.passed and self.error is not None:
            raise ConfigError("OutcomeReceipt.error", self.error, "None when passed is True")
        force_setattr(self, "observed", _check_scalars("OutcomeReceipt.observed", self.observed))
        force_setattr(self, "expected", _check_scalars("OutcomeReceipt.expected", self.expected))

    def to_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict."""
        return _builtins(self)

    @property
    def failure(self) -> str | None:
        """Why the check failed, in words (``None`` when it passed).

        The ``error`` when the check could not finish; else each expectation that did not
        hold, from ``expected`` against ``observed`` (``status: expected 'paid', observed
        'sent'``; ``size=10 below min_size=1024``; a missing row or column).
        """
        if self.passed:
            return None
        if self.error is not None:
            return self.error
        parts: list[str] = []
        unseen: list[str] = []
        for key, want in self.expected.items():
            if key in self.observed:
                seen = self.observed[key]
                if seen != want:
                    parts.append(f"{key}: expected {_short(want)}, observed {_short(seen)}")
                continue
            bound, _, name = key.partition("_")
            seen = self.observed.get(name)
            if bound in ("min", "max") and _is_number(seen) and _is_number(want):
                low = bound == "min" and seen < want  # type: ignore[operator]
                high = bound == "max" and seen > want  # type: ignore[operator]
                if low or high:
                    parts.append(f"{name}={seen} {'below' if low else 'above'} {key}={want}")
            elif key != "pattern":
                unseen.append(f"{key}: expected {_short(want)}, not observed")
        missing = self.observed.get("missing_columns")
        if isinstance(missing, str) and missing:
            parts.append(f"missing columns: {missing}")
        if self.observed.get("matches") is False:
            parts.append(f"does not match the pattern {_short(self.expected.get('pattern'))}")
        detail = self.observed.get("detail")
        if isinstance(detail, str) and detail:
            parts.append(detail)
        parts = parts or unseen  # what was not observed explains only when nothing else does
        return "; ".join(parts) if parts else "the check did not pass"

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<outcome>") -> OutcomeReceipt:
        """Rebuild a receipt from :meth:`to_dict` output.

        Raises:
            InputError: naming ``source`` and the field, when ``data`` is not a receipt (a
                model's ``{"status": "done"}`` is not one).
        """
        return _convert(data, cls, source)


class StopReceipt(_Value, frozen=True, kw_only=True):
    """Why one run stopped, recorded at the integration boundary. No prompts, no payloads.

    Round-trips exactly through :meth:`to_json` / :meth:`from_json`; the ``schema`` field
    versions the format.
    """

    schema: str = SCHEMA
    """The receipt format version; always :data:`SCHEMA` for receipts built by this code."""
    run_id: str
    """The run (trace) id."""
    agent: str
    """The agent's name; also the identity whose self-checks never count as receipts."""
    end: EndKind | None
    """How the loop ended, from the control flow; ``None`` when the boundary did not see it."""
    reason: StopReason | None
    """The stop reason (which condition fired); ``None`` when none was recorded."""
    condition: Mapping[str, Scalar] = msgspec.field(default_factory=dict)
    """Inputs of the condition that fired, e.g. ``{"steps": 20, "max_steps": 20}``: the
    observed value under the counter's name and the configured cap under ``max_<name>``."""
    policy_version: str | None = None
    """Version of the loop/budget policy in force."""
    normalizer_version: str | None = None
    """Version of the signature normalizer, so a normalizer change is not read as recovery."""
    counters: Counters = msgspec.field(default_factory=Counters)
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

    def __post_init__(self) -> None:
        if self.schema != SCHEMA:
            raise ConfigError("StopReceipt.schema", self.schema, repr(SCHEMA))
        _check_text("StopReceipt.run_id", self.run_id, "a non-empty str", optional=False)
        _check_text("StopReceipt.agent", self.agent, "a non-empty agent name", optional=False)
        for name, cls, expected in (
            ("end", EndKind, "an EndKind or None"),
            ("reason", StopReason, "a StopReason or None"),
            ("verdict", Verdict, "a Verdict or None"),
            ("approval", Approval, "an Approval or None"),
            ("tool_failure", ToolFailure, "a ToolFailure or None"),
            ("after_stop", AfterStop, "an AfterStop or None"),
        ):
            value = getattr(self, name)
            if value is not None and not isinstance(value, cls):
                raise ConfigError(f"StopReceipt.{name}", value, expected)
        if not isinstance(self.requires_outcome, OutcomeRequirement):
            raise ConfigError(
                "StopReceipt.requires_outcome", self.requires_outcome, "an OutcomeRequirement"
            )
        if not isinstance(self.counters, Counters):
            raise ConfigError("StopReceipt.counters", self.counters, "a Counters")
        _check_text("StopReceipt.policy_version", self.policy_version, "a str or None")
        _check_text("StopReceipt.normalizer_version", self.normalizer_version, "a str or None")
        if not isinstance(self.outcomes, (tuple, list)):
            raise ConfigError(
                "StopReceipt.outcomes", type(self.outcomes).__name__, "OutcomeReceipt values"
            )
        outcomes = tuple(self.outcomes)
        for item in outcomes:
            if not isinstance(item, OutcomeReceipt):
                raise ConfigError(
                    "StopReceipt.outcomes", type(item).__name__, "OutcomeReceipt values"
                )
        force_setattr(self, "outcomes", outcomes)
        force_setattr(self, "condition", _check_scalars("StopReceipt.condition", self.condition))
        started = _check_seconds("StopReceipt.started_at", self.started_at)
        ended = _check_seconds("StopReceipt.ended_at", self.ended_at)
        if started is not None and ended is not None and ended < started:
            raise ConfigError("StopReceipt.ended_at", ended, f"a time >= started_at ({started})")
        force_setattr(self, "started_at", started)
        force_setattr(self, "ended_at", ended)

    def to_dict(self) -> dict[str, Any]:
        """The receipt as a JSON-ready dict (enums as their values, tuples as lists)."""
        return _builtins(self)

    def to_json(self, *, indent: int | None = None) -> str:
        """The receipt as JSON text; ``from_json(r.to_json()) == r`` for every receipt."""
        data = msgspec.json.encode(self)
        if indent is not None:
            data = msgspec.json.format(data, indent=indent)
        return data.decode()

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<receipt>") -> StopReceipt:
        """Rebuild a receipt from :meth:`to_dict` output, validating every field.

        Raises:
            InputError: naming ``source`` and the offending field (unknown keys, wrong types,
                an unsupported ``schema``).
        """
        return _convert(data, cls, source)

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "<receipt>") -> StopReceipt:
        """Parse JSON text into a receipt.

        Raises:
            InputError: naming ``source`` (and the line) for invalid JSON, and the field for
                an invalid receipt.
        """
        if isinstance(text, str):
            text = text.removeprefix("\ufeff")
        else:
            text = text.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark
        try:
            return msgspec.json.decode(text, type=cls)
        except msgspec.ValidationError as exc:
            raise _schema_error(text, source) or _validation_error(exc, source) from None
        except msgspec.DecodeError as exc:
            raise _decode_error(exc, text, source) from None
        except RecursionError:
            raise InputError(source, _TOO_DEEP) from None


# --------------------------------------------------------------------------------------------
# Encoding and decoding: msgspec does the work; these name the source and the field.


_V = TypeVar("_V", bound=_Value)

_AT: Final = re.compile(r"^(?P<detail>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN: Final = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`$")
_MISSING: Final = re.compile(r"^Object missing required field `(?P<name>[^`]*)`$")
_BAD_ENUM: Final = re.compile(r"^Invalid enum value ")
_BYTE: Final = re.compile(r"\(byte (?P<at>\d+)\)$")
_ENUM_FIELDS: Final[Mapping[str, type[Enum]]] = {
    "end": EndKind,
    "reason": StopReason,
    "verdict": Verdict,
    "requires_outcome": OutcomeRequirement,
    "kind": VerifierKind,
    "evidence": Evidence,
}


def _builtins(value: _Value) -> dict[str, Any]:
    out = msgspec.to_builtins(value)
    assert isinstance(out, dict)
    return out


_TOO_DEEP: Final = "nested too deeply to be a stop receipt"


class _SchemaOnly(msgspec.Struct):
    """Just the ``schema`` field of a receipt, whatever else it holds."""

    schema: str | int | float | bool | None = None


def _convert(data: Any, cls: type[_V], source: str) -> _V:
    if not isinstance(data, Mapping):
        raise InputError(source, f"expected a JSON object, got {type(data).__name__}")
    try:
        return msgspec.convert(data, type=cls)
    except RecursionError:
        raise InputError(source, _TOO_DEEP) from None
    except msgspec.ValidationError as exc:
        if cls is StopReceipt:
            raise _schema_error(data, source) or _validation_error(exc, source) from None
        raise _validation_error(exc, source) from None


def _schema_error(data: Any, source: str) -> InputError | None:
    """The error for a receipt of another format version: said first, before its fields."""
    try:
        if isinstance(data, (str, bytes)):
            schema = msgspec.json.decode(data, type=_SchemaOnly).schema
        else:
            schema = data.get("schema", SCHEMA)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if schema == SCHEMA or schema is None:
        return None
    return InputError(
        source,
        f"field 'schema': unsupported receipt schema {schema!r}; this tripwire reads "
        f"{SCHEMA!r} (a receipt written by another tripwire version: read it with that one)",
    )


def _join(path: str, name: str) -> str:
    if not name:
        return path
    if name.startswith("["):
        return path + name
    return f"{path}.{name}" if path else name


def _validation_error(exc: msgspec.ValidationError, source: str) -> InputError:
    """An :class:`InputError` naming the field path of a msgspec validation error."""
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    detail = match["detail"]
    path = (match["path"] or "").lstrip(".")
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ConfigError):
        # A constructor check fired: its field is "Class.name[...]", relative to the path.
        name = cause.field.split(".", 1)[-1]
        path = _join(path, name)
        detail = f"expected {cause.expected}, got {cause.value!r}"
    elif unknown := _UNKNOWN.match(detail):
        path = _join(path, unknown["name"])
        detail = "unknown field"
    elif missing := _MISSING.match(detail):
        path = _join(path, missing["name"])
        detail = "missing"
    elif _BAD_ENUM.match(detail) and path.rsplit(".", 1)[-1] in _ENUM_FIELDS:
        allowed = ", ".join(repr(m.value) for m in _ENUM_FIELDS[path.rsplit(".", 1)[-1]])
        detail = f"expected one of {allowed}, got {detail[len('Invalid enum value ') :]}"
    else:
        detail = detail[:1].lower() + detail[1:]
    return InputError(source, f"field '{path}': {detail}" if path else detail)


def _decode_error(exc: msgspec.DecodeError, text: str | bytes, source: str) -> InputError:
    """An :class:`InputError` with the line (and column) of malformed JSON."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    detail = str(exc).removeprefix("JSON is malformed: ")
    at = _BYTE.search(detail)
    if at is not None:
        offset = int(at["at"])
    elif "truncated" in detail:
        offset = len(data)
    else:
        return InputError(source, f"not valid JSON: {detail}")
    line = data.count(b"\n", 0, offset) + 1
    column = offset - (data.rfind(b"\n", 0, offset) + 1) + 1
    if at is not None:
        detail = detail[: at.start()].rstrip()
    return InputError(source, f"not valid JSON: {detail} (column {column})", line=line)


# The health classification lives in its own module; it is re-exported here, where it has
# always been imported from. (It imports this module, which is complete by this line.)
from tripwire.core.health import Health, HealthState, classify  # noqa: E402
